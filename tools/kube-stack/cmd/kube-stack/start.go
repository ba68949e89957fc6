package main

// Starting the stack: its certificates, tokens, kubeconfigs and components' configuration written, then each
// component started in order and waited for until it is ready.

import (
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The pod network: an address range routed nowhere, answered for by ray-dashboard-sim through the API server's
// "cluster" egress.
const (
	podCIDR  = "198.18.0.0/16"
	kwokCIDR = "198.18.0.1/16" // kwok's --cidr: the range's first address and its prefix length
)

// Bounds of the start-up waits, in seconds (as the shell version had them).
const (
	etcdReadyS        = 60
	apiServerReadyS   = 180
	controllersReadyS = 120
	operatorsReadyS   = 180
	dashboardReadyS   = 30
	serviceAccountS   = 60
	crdEstablishedS   = 120
	checkTimeout      = 10 * time.Second // one readiness request
	stopGrace         = 5 * time.Second  // between TERM and KILL, per component
)

func writeFile(path, text string) error { return os.WriteFile(path, []byte(text), 0o644) }

func kubeconfig(server, ca, user, token string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: trainyard
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: trainyard
  context:
    cluster: trainyard
    user: %s
    namespace: default
current-context: trainyard
`, server, ca, user, token, user)
}

// privateDir: a command prefix that runs a program with src mounted on dst in a mount namespace of its own;
// where that cannot be done, nothing, and src's files are copied to dst (when dst has no tls.crt).
func privateDir(src, dst string) []string {
	if os.MkdirAll(dst, 0o755) == nil &&
		exec.Command("unshare", "--mount", "--propagation", "private", "--", "true").Run() == nil {
		return []string{"unshare", "--mount", "--propagation", "private", "--",
			"sh", "-c", `mount --bind "$0" "$1" && shift && exec "$@"`, src, dst}
	}
	say("no private mount namespace here: using %s as it is", dst)
	if _, err := os.Stat(filepath.Join(dst, "tls.crt")); err != nil {
		exec.Command("cp", "-r", src+"/.", dst+"/").Run()
	}
	return nil
}

func (s *stack) start() error {
	p, err := freePorts(15)
	if err != nil {
		return err
	}
	pEtcd, pPeer, pAPI, pKCM, pSched, pKwok := p[0], p[1], p[2], p[3], p[4], p[5]
	pTOMetrics, pTOProbe, pTOHook, pKRMetrics, pKRProbe := p[6], p[7], p[8], p[9], p[10]
	pKQMetrics, pKQProbe, pKQHook, pDash := p[11], p[12], p[13], p[14]
	dir, pki, bin := s.dir, s.pki, s.bin
	port := strconv.Itoa

	// ---- certificates, tokens, kubeconfigs
	if err := writePKI(pki); err != nil {
		return die("writing the certificates: %v", err)
	}
	// Real nodes (--real-nodes): their bridges, cgroups and dirs, and the API server's route to them.
	nodeTokens := ""
	egressSock := s.path("egress.sock")
	if s.realNodes > 0 {
		if err := s.prepareRealNodes(); err != nil {
			return err
		}
		nodeTokens = s.nodes.tokenLines()
		egressSock = s.path("egress-router.sock")
	}
	s.adminToken = token()
	kcmToken, schedToken := token(), token()
	if err := writeFile(filepath.Join(pki, "tokens.csv"), fmt.Sprintf(
		"%s,admin,uid-admin,\"system:masters\"\n%s,system:kube-controller-manager,uid-kcm\n"+
			"%s,system:kube-scheduler,uid-scheduler\n", s.adminToken, kcmToken, schedToken)+nodeTokens); err != nil {
		return err
	}
	s.apiURL = "https://127.0.0.1:" + port(pAPI)
	caFile := filepath.Join(pki, "ca.crt")
	for _, k := range []struct{ file, user, token string }{
		{"kubeconfig", "admin", s.adminToken},
		{"kcm.kubeconfig", "system:kube-controller-manager", kcmToken},
		{"scheduler.kubeconfig", "system:kube-scheduler", schedToken},
	} {
		if err := writeFile(s.path(k.file), kubeconfig(s.apiURL, caFile, k.user, k.token)); err != nil {
			return err
		}
	}
	os.Setenv("KUBECONFIG", s.path("kubeconfig"))
	s.kubectl = []string{filepath.Join(bin, "kubectl"), "--kubeconfig", s.path("kubeconfig")}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	caPool := x509.NewCertPool()
	caPool.AppendCertsFromPEM(caPEM)

	// ---- etcd
	etcdURL := "http://127.0.0.1:" + port(pEtcd)
	peerURL := "http://127.0.0.1:" + port(pPeer)
	if err := s.startProc("etcd", nil, filepath.Join(bin, "etcd"), "--name=trainyard", "--data-dir="+s.path("etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=trainyard="+peerURL, "--unsafe-no-fsync", "--quota-backend-bytes=8589934592",
		"--log-level=warn"); err != nil {
		return err
	}
	if err := s.waitFor("etcd", etcdReadyS, s.httpOK(etcdURL+"/health", nil)); err != nil {
		return err
	}
	say("etcd ready (%s s)", s.since())

	// ---- kube-apiserver. Its traffic to nodes and pods (the "cluster" egress: logs through kwok's kubelet
	// server, the pod proxy) goes through the pod network stand-in (ray-dashboard-sim), which answers for the
	// simulated pods in podCIDR, an address range that is routed nowhere.
	if err := writeFile(s.path("egress.yaml"), `apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: `+egressSock+"\n"); err != nil {
		return err
	}
	var apiServerExtra []string
	if s.nodes != nil {
		apiServerExtra = s.nodes.apiServerFlags()
	}
	// TRAINYARD_KUBE_AUDIT=1: an audit log of every request once it completed (metadata only: user, user agent,
	// verb, resource), for benchmarks that count each client's requests (kube-bench counts Kueue's by its user
	// agent). Off by default: it costs the API server a line per request.
	if os.Getenv("TRAINYARD_KUBE_AUDIT") == "1" {
		if err := writeFile(s.path("audit-policy.yaml"), `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
`); err != nil {
			return err
		}
		apiServerExtra = append(apiServerExtra, "--audit-policy-file="+s.path("audit-policy.yaml"),
			"--audit-log-path="+s.path("audit.log"), "--audit-log-format=json", "--audit-log-maxsize=0",
			"--audit-log-mode=batch", "--audit-log-batch-max-wait=1s")
	}
	if err := s.startProc("kube-apiserver", nil, append([]string{filepath.Join(bin, "kube-apiserver"),
		"--egress-selector-config-file=" + s.path("egress.yaml"),
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + port(pAPI),
		"--tls-cert-file=" + filepath.Join(pki, "server.crt"), "--tls-private-key-file=" + filepath.Join(pki, "server.key"),
		"--client-ca-file=" + caFile, "--token-auth-file=" + filepath.Join(pki, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(pki, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(pki, "sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16", "--endpoint-reconciler-type=none",
		"--kubelet-preferred-address-types=InternalIP", "--allow-privileged=true",
		"--max-requests-inflight=1000", "--max-mutating-requests-inflight=500",
		"--profiling=false", "--v=1"}, apiServerExtra...)...); err != nil {
		return err
	}
	if err := s.waitFor("kube-apiserver", apiServerReadyS, s.httpOK(s.apiURL+"/readyz", caPool)); err != nil {
		return err
	}
	say("kube-apiserver ready (%s s)", s.since())

	// ---- kube-controller-manager, kube-scheduler. kwok renews a thousand nodes' leases from one process: on a
	// loaded two-core machine it falls behind by tens of seconds, and a node is only called NotReady (Unknown)
	// here after 5 minutes without a heartbeat (a test that wants a NotReady node says so with a label, see
	// stages/).
	kcmConfig := s.path("kcm.kubeconfig")
	if err := s.startProc("kube-controller-manager", nil, filepath.Join(bin, "kube-controller-manager"),
		"--kubeconfig="+kcmConfig,
		"--authentication-kubeconfig="+kcmConfig, "--authorization-kubeconfig="+kcmConfig,
		"--bind-address=127.0.0.1", "--secure-port="+port(pKCM), "--leader-elect=false",
		"--service-account-private-key-file="+filepath.Join(pki, "sa.key"), "--root-ca-file="+caFile,
		"--use-service-account-credentials=true",
		"--kube-api-qps=200", "--kube-api-burst=400", "--concurrent-gc-syncs=20",
		"--node-monitor-grace-period=300s", "--v=1"); err != nil {
		return err
	}
	schedConfig := s.path("scheduler.kubeconfig")
	if err := writeFile(s.path("scheduler.yaml"), `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: `+schedConfig+`
  qps: 200
  burst: 400
leaderElection:
  leaderElect: false
`); err != nil {
		return err
	}
	if err := s.startProc("kube-scheduler", nil, filepath.Join(bin, "kube-scheduler"),
		"--config="+s.path("scheduler.yaml"),
		"--authentication-kubeconfig="+schedConfig, "--authorization-kubeconfig="+schedConfig,
		"--bind-address=127.0.0.1", "--secure-port="+port(pSched), "--v=1"); err != nil {
		return err
	}

	// ---- kwok: manages nodes annotated kwok.x-k8s.io/node=fake; nodes' kubelet address is kwok's own server on
	// loopback (logs, exec), pods get addresses in podCIDR. Every simulated container's log is the file written
	// here, in the container runtime's log format (what a kubelet reads its answer to a log request from).
	if err := writeFile(s.path("container.log"), `2026-01-01T00:00:00.100000000Z stdout F simulated container: started
2026-01-01T00:00:00.200000000Z stderr F simulated container: a line on stderr
2026-01-01T00:00:01.000000000Z stdout F simulated container: step 1 loss 0.50
2026-01-01T00:00:01.000000000Z stdout F simulated container: step 2 loss 0.25
2026-01-01T00:00:02.500000000Z stdout F simulated container: done
`); err != nil {
		return err
	}
	if err := writeFile(s.path("logs.yaml"), `apiVersion: kwok.x-k8s.io/v1alpha1
kind: ClusterLogs
metadata:
  name: trainyard-sim
spec:
  selector: {}
  logs:
  - logsFile: `+s.path("container.log")+`
    follow: true
`); err != nil {
		return err
	}
	if err := s.startProc("kwok", []string{"HOME=" + s.path("home")}, filepath.Join(bin, "kwok"),
		"--kubeconfig="+s.path("kubeconfig"),
		"--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		"--node-lease-duration-seconds=40",
		"--cidr="+kwokCIDR, "--node-ip=127.0.0.1", "--node-port="+port(pKwok),
		"--server-address=127.0.0.1:"+port(pKwok),
		"--tls-cert-file="+filepath.Join(pki, "server.crt"), "--tls-private-key-file="+filepath.Join(pki, "server.key"),
		"--config="+filepath.Join(s.ks, "stages", "node.yaml"), "--config="+filepath.Join(s.ks, "stages", "pod.yaml"),
		"--config="+s.path("logs.yaml")); err != nil {
		return err
	}

	// ---- CRDs, from the operators' own module sources (server-side apply: the CRDs are too large for
	// kubectl apply)
	os.Remove(s.path("logs", "crds.log"))
	if err := s.kube("", "apply", "--server-side", "--force-conflicts", "-f", filepath.Join(s.cache, "crds")+"/"); err != nil {
		return crdFailure(err, "installing the CRDs failed: "+s.crdsLog())
	}
	if s.withKueue {
		if err := s.kube("", "apply", "--server-side", "--force-conflicts", "-f", filepath.Join(s.cache, "crds", "kueue")+"/"); err != nil {
			return crdFailure(err, "installing Kueue's CRDs failed: "+s.crdsLog())
		}
	}
	if err := s.kube("", "wait", "--for=condition=Established", fmt.Sprintf("--timeout=%ds", crdEstablishedS), "crd", "--all"); err != nil {
		return crdFailure(err, "CRDs not established: "+s.crdsLog())
	}
	say("CRDs established (%s s)", s.since())

	// ---- the training operator (PyTorchJob only). Its cert rotator only reports ready once it has written its
	// CA into the webhook configuration it is told to manage; the API server has no route to the operator's
	// webhook here (it would go through a Service), so that configuration holds no webhook.
	if err := s.kube(`apiVersion: v1
kind: Namespace
metadata:
  name: kubeflow
---
apiVersion: v1
kind: Secret
metadata:
  name: training-operator-webhook-cert
  namespace: kubeflow
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validator.training-operator.kubeflow.org
webhooks: []
`, "apply", "--server-side", "-f", "-"); err != nil {
		return crdFailure(err, "training operator's objects refused: "+s.crdsLog())
	}
	// The operator waits for its webhook serving certificate to appear in /tmp/k8s-webhook-server/serving-certs
	// (a fixed path where a pod would mount the secret). Each stack gives it its own directory there through a
	// private mount namespace, so two stacks never share it; the stack's certificate stands in (no caller
	// checks it).
	certs := s.path("webhook-certs", "serving-certs")
	if err := os.MkdirAll(certs, 0o755); err != nil {
		return err
	}
	for from, to := range map[string]string{"server.crt": "tls.crt", "server.key": "tls.key"} {
		if err := copyFile(filepath.Join(pki, from), filepath.Join(certs, to)); err != nil {
			return err
		}
	}
	private := privateDir(s.path("webhook-certs"), "/tmp/k8s-webhook-server")
	toArgs := append(private, filepath.Join(bin, "training-operator"),
		"--enable-scheme=pytorchjob",
		"--metrics-bind-address=127.0.0.1:"+port(pTOMetrics), "--health-probe-bind-address=127.0.0.1:"+port(pTOProbe),
		"--webhook-server-port="+port(pTOHook), "--kube-api-qps=200", "--kube-api-burst=400",
		"--controller-threads=16")
	if s.realNodes > 0 {
		// Workers' init container (by default alpine, which nothing here serves): ours, from the stack's registry.
		toArgs = append(toArgs, "--pytorch-init-container-image="+s.nodes.initRef)
	}
	// The operator adds that init container to every worker with no securityContext, which a namespace that
	// enforces Pod Security `restricted` refuses: configured as such a cluster's admin would, with the
	// operator's own template plus what `restricted` asks (the pod's user and seccomp profile apply to it).
	initTemplate := s.path("pytorch-init-container.yaml")
	if err := writeFile(initTemplate, pytorchInitTemplate); err != nil {
		return err
	}
	toArgs = append(toArgs, "--pytorch-init-container-template-file="+initTemplate)
	if err := s.startProc("training-operator", []string{"MY_POD_NAMESPACE=kubeflow"}, toArgs...); err != nil {
		return err
	}

	// ---- KubeRay. It asks each RayCluster's dashboard (http://<head svc>.<ns>.svc.cluster.local:8265) for its
	// jobs with a plain HTTP client; HTTP_PROXY sends those requests to our dashboard stand-in on loopback (no Ray
	// head runs under kwok). Requests to the API server (loopback) never go through a proxy.
	dash := "127.0.0.1:" + port(pDash)
	simArgs := []string{filepath.Join(bin, "ray-dashboard-sim"),
		"--listen=" + dash, "--api-server=" + s.apiURL,
		"--pod-cidr=" + podCIDR, "--egress-socket=" + s.path("egress.sock"),
		"--token=" + s.adminToken, "--ca=" + caFile}
	if s.nodes != nil {
		// Heads on the real nodes have a real dashboard: the stand-in passes their requests on.
		simArgs = append(simArgs, "--real-cidr="+realClusterCIDR)
	}
	if err := s.startProc("ray-dashboard-sim", nil, simArgs...); err != nil {
		return err
	}
	if err := s.startProc("kuberay-operator", []string{"HTTP_PROXY=http://" + dash, "http_proxy=http://" + dash,
		"NO_PROXY=127.0.0.1,localhost", "no_proxy=127.0.0.1,localhost"}, filepath.Join(bin, "kuberay-operator"),
		"--metrics-addr=127.0.0.1:"+port(pKRMetrics), "--health-probe-bind-address=127.0.0.1:"+port(pKRProbe),
		"--enable-leader-election=false", "--qps=200", "--burst=400", "--log-stdout-encoder=console"); err != nil {
		return err
	}

	// ---- Kueue (unless --without-kueue): PyTorchJob and RayJob integrations. Its webhooks are not registered
	// (the API server has no route to them here), so a job queued through Kueue is created suspended
	// (spec.runPolicy.suspend / spec.suspend true) with the label kueue.x-k8s.io/queue-name; Kueue creates its
	// Workload and un-suspends it on admission. No internal cert rotation (the stack's certificate is served),
	// no visibility API server.
	if s.withKueue {
		if err := s.kube("", "create", "namespace", "kueue-system"); err != nil {
			return crdFailure(err, "creating the namespace kueue-system failed: "+s.crdsLog())
		}
		if err := writeFile(s.path("kueue.yaml"), fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: 127.0.0.1:%d
metrics:
  bindAddress: 127.0.0.1:%d
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
clientConnection:
  qps: 200
  burst: 400
integrations:
  frameworks:
  - kubeflow.org/pytorchjob
  - ray.io/rayjob
`, pKQProbe, pKQMetrics, pKQHook, certs)); err != nil {
			return err
		}
		// With internal cert management off, Kueue serves metrics with the certificate in a fixed directory.
		private := privateDir(certs, "/etc/kueue/metrics/certs")
		if err := s.startProc("kueue", nil, append(private, filepath.Join(bin, "kueue"),
			"--config="+s.path("kueue.yaml"), "--feature-gates=VisibilityOnDemand=false")...); err != nil {
			return err
		}
	}

	// ---- real nodes (while the operators start): registry and images, CoreDNS, containerd and kubelet per node, kube-proxy
	if s.nodes != nil {
		if err := s.nodes.start(); err != nil {
			return err
		}
	}

	waits := []struct {
		name   string
		limitS int
		url    string
	}{
		{"kube-controller-manager", controllersReadyS, "https://127.0.0.1:" + port(pKCM) + "/healthz"},
		{"kube-scheduler", controllersReadyS, "https://127.0.0.1:" + port(pSched) + "/healthz"},
		{"kwok", controllersReadyS, "https://127.0.0.1:" + port(pKwok) + "/healthz"},
		{"training-operator", operatorsReadyS, "http://127.0.0.1:" + port(pTOProbe) + "/readyz"},
		{"kuberay-operator", operatorsReadyS, "http://127.0.0.1:" + port(pKRProbe) + "/readyz"},
		{"ray-dashboard-sim", dashboardReadyS, "http://" + dash + "/healthz"},
	}
	if s.withKueue {
		waits = append(waits, struct {
			name   string
			limitS int
			url    string
		}{"kueue", operatorsReadyS, "http://127.0.0.1:" + port(pKQProbe) + "/readyz"})
	}
	for _, w := range waits {
		if err := s.waitFor(w.name, w.limitS, s.httpOK(w.url, nil)); err != nil {
			return err
		}
	}
	// The namespace "default" needs its service account before pods can be created in it.
	if err := s.waitFor("kube-controller-manager", serviceAccountS, func() bool {
		cmd := exec.CommandContext(s.ctx, s.kubectl[0], append(s.kubectl[1:], "get", "serviceaccount", "default", "-n", "default")...)
		return cmd.Run() == nil
	}); err != nil {
		return err
	}
	envText := fmt.Sprintf("KUBECONFIG=%s\nTRAINYARD_KUBE_STACK=%s\nTRAINYARD_KUBE_BIN=%s\n", s.path("kubeconfig"), dir, bin)
	if os.Getenv("TRAINYARD_KUBE_AUDIT") == "1" {
		envText += "TRAINYARD_KUBE_AUDIT_LOG=" + s.path("audit.log") + "\n"
		os.Setenv("TRAINYARD_KUBE_AUDIT_LOG", s.path("audit.log"))
	}
	if s.nodes != nil {
		if err := s.nodes.ready(); err != nil {
			return err
		}
		say("real nodes ready (%s s): %s", s.since(), strings.Join(s.nodes.names(), ", "))
		envText += s.nodes.envLines()
		s.nodes.setEnv()
	}
	say("stack ready in %s s: %s (KUBECONFIG=%s)", s.since(), dir, s.path("kubeconfig"))

	if err := writeFile(s.path("env"), envText); err != nil {
		return err
	}
	os.Setenv("TRAINYARD_KUBE_STACK", dir)
	os.Setenv("TRAINYARD_KUBE_BIN", bin)
	os.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	if s.ctx.Err() != nil {
		return errSignalled
	}
	return nil
}

// crdFailure: a signal, or the failure with its message.
func crdFailure(err error, msg string) error {
	if err == errSignalled {
		return err
	}
	return die("%s", strings.TrimRight(msg, "\n"))
}

// The training operator's default init container for workers (v1.9, pkg/controller.v1/pytorch/initcontainer.go),
// with a securityContext that Pod Security `restricted` admits.
const pytorchInitTemplate = `
- name: init-pytorch
  image: {{.InitContainerImage}}
  imagePullPolicy: IfNotPresent
  securityContext:
    allowPrivilegeEscalation: false
    capabilities:
      drop: ["ALL"]
  resources:
    limits:
      cpu: 100m
      memory: 20Mi
    requests:
      cpu: 50m
      memory: 10Mi
  command: ['sh', '-c', 'err=1;for i in $(seq {{.MaxTries}}); do if nslookup {{.MasterAddr}}; then err=0 && break; fi;echo waiting for master; sleep 2; done; exit $err']
`
