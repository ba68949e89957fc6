package main

// smoke: the smoke test of the Kubernetes test stack, run as `scripts/with-kube scripts/kube-smoke`.
// Against the real API server, the real training operator and KubeRay, with kwok's simulated nodes, it checks:
// two fake nodes go Ready; a PyTorchJob (master + worker, pinned to the nodes, run-ms 3000) goes Running then
// Succeeded; one with exit-code 3 goes Failed; a RayJob gets its RayCluster and a head and a worker pod Running,
// then SUCCEEDED through the dashboard stand-in (HTTPMode); an object the CRD schema refuses is a 422; Kueue (when
// the stack runs it) admits and un-suspends a queued PyTorchJob; the sim labels for OOM, image pull errors and
// node NotReady behave; a container's log and the pod proxy to a pod's port answer through the API server;
// deleting a job removes its pods (garbage collection) and deleting the namespace removes everything. When the
// stack has real nodes (with-kube --real-nodes 2), real containers on them too: see smoke_real.go
// (`kube-smoke --real-only` runs only that part).
//
// A wait that times out ends the test there (exit 1): what follows depends on it. The other checks are counted,
// and any failed one makes the exit code 1.

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"
)

// How long the master of a failed PyTorchJob may take to show its own exit code after the job is Failed.
const masterExitS = 10

type smokeTest struct {
	ns       string
	t0       time.Time
	failures int
}

// kubectl runs kubectl (from PATH, the stack's) with stdin; stdout and stderr are returned.
func kubectl(stdin string, args ...string) (string, string, error) {
	cmd := exec.Command("kubectl", args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	return out.String(), errOut.String(), err
}

func (t *smokeTest) log(format string, args ...any) {
	fmt.Printf("[%5.1fs] %s\n", time.Since(t.t0).Seconds(), fmt.Sprintf(format, args...))
}

func (t *smokeTest) fail(format string, args ...any) {
	t.log("FAIL: "+format, args...)
	t.failures++
}

// must runs kubectl, its output dropped and its errors shown; a failure ends the test.
func (t *smokeTest) must(stdin string, args ...string) {
	if _, errOut, err := kubectl(stdin, args...); err != nil {
		os.Stderr.WriteString(errOut)
		t.log("FAIL: kubectl %s: %v", strings.Join(args, " "), err)
		os.Exit(1)
	}
}

// waitUntil polls check every 0.25 s until it gives a non-empty output, printed with the description; after
// limitS seconds the test fails and ends there.
func (t *smokeTest) waitUntil(limitS int, what string, check func() string) {
	deadline := time.Now().Add(time.Duration(limitS) * time.Second)
	for {
		if out := check(); out != "" {
			t.log("ok: %s (%s)", what, out)
			return
		}
		if !time.Now().Before(deadline) {
			t.fail("%s (not seen within %ds)", what, limitS)
			os.Exit(1)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// get: kubectl get's output ("" on an error), with its trailing newlines trimmed.
func get(args ...string) string {
	out, _, err := kubectl("", append([]string{"get"}, args...)...)
	if err != nil {
		return ""
	}
	return strings.TrimRight(out, "\n")
}

// jget: one object's fields in the test's namespace by a JSONPath.
func (t *smokeTest) jget(kind, name, jsonpath string) string {
	return get("-n", t.ns, kind, name, "-o", "jsonpath="+jsonpath)
}

// cond: "<type>=True" when the object's condition of that type is True, else "".
func (t *smokeTest) cond(kind, name, typ string) func() string {
	return func() string {
		if t.jget(kind, name, `{.status.conditions[?(@.type=="`+typ+`")].status}`) == "True" {
			return typ + "=True"
		}
		return ""
	}
}

// lines: the lines of out that match (grep).
func lines(out string, match func(string) bool) string {
	var hits []string
	for _, l := range strings.Split(out, "\n") {
		if match(l) {
			hits = append(hits, l)
		}
	}
	return strings.Join(hits, "\n")
}

func prefix(p string) func(string) bool {
	return func(l string) bool { return strings.HasPrefix(l, p) }
}
func exactly(p string) func(string) bool { return func(l string) bool { return l == p } }
func contains(p string) func(string) bool {
	return func(l string) bool { return strings.Contains(l, p) }
}

// gone: "gone" once kubectl get says the object is not found.
func gone(args ...string) func() string {
	return func() string {
		_, errOut, err := kubectl("", append([]string{"get"}, args...)...)
		if err != nil && strings.Contains(errOut, "NotFound") {
			return "gone"
		}
		return ""
	}
}

// podsOf: "name phase node podIP" lines of the pods with these labels.
func (t *smokeTest) podsOf(selector string) string {
	return get("-n", t.ns, "pods", "-l", selector, "-o",
		`jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.nodeName} {.status.podIP}{"\n"}{end}`)
}

func (t *smokeTest) printPods(selector string) {
	for _, l := range strings.Split(t.podsOf(selector), "\n") {
		if l != "" {
			fmt.Println("    pod " + l)
		}
	}
}

func (t *smokeTest) pytorchJob(name string, exitCode int) {
	extra := ""
	if exitCode != 0 {
		extra = fmt.Sprintf("\n            sim.trainyard.dev/exit-code: \"%d\"", exitCode)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: %s
  namespace: %s
spec:
  runPolicy:
    backoffLimit: 0
  pytorchReplicaSpecs:
`, name, t.ns)
	for _, role := range []string{"Master", "Worker"} {
		node := t.ns + "-node-a"
		if role == "Worker" {
			node = t.ns + "-node-b"
		}
		fmt.Fprintf(&b, `    %s:
      replicas: 1
      restartPolicy: Never
      template:
        metadata:
          labels:
            sim.trainyard.dev/run-ms: "3000"%s
        spec:
          affinity:
            nodeAffinity:
              requiredDuringSchedulingIgnoredDuringExecution:
                nodeSelectorTerms:
                - matchExpressions:
                  - key: kubernetes.io/hostname
                    operator: In
                    values: ["%s"]
          containers:
          - name: pytorch
            image: example.invalid/trainyard/pytorch:smoke
            command: ["bash", "-c", "torchrun train.py"]
            resources:
              limits:
                nvidia.com/gpu: "1"
`, role, extra, node)
	}
	t.must(b.String(), "create", "-f", "-")
}

func (t *smokeTest) barePod(name, labels string) {
	t.must(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  labels: {%s}
spec:
  restartPolicy: Never
  nodeName: %s-node-a
  containers:
  - name: main
    image: example.invalid/trainyard/app:smoke
`, name, t.ns, labels, t.ns), "create", "-f", "-")
}

func smoke(args []string) int {
	if os.Getenv("KUBECONFIG") == "" {
		fmt.Fprintln(os.Stderr, "kube-smoke: KUBECONFIG: run under scripts/with-kube")
		return 1
	}
	realOnly := false
	for _, a := range args {
		if a != "--real-only" {
			fmt.Fprintln(os.Stderr, "usage: kube-smoke [--real-only]")
			return 2
		}
		realOnly = true
	}
	var realNodes []string
	if v := os.Getenv("TRAINYARD_KUBE_REAL_NODES"); v != "" {
		realNodes = strings.Split(v, ",")
	}
	if realOnly && len(realNodes) < 2 {
		fmt.Fprintln(os.Stderr, "kube-smoke --real-only: run under scripts/with-kube --real-nodes 2 (or more)")
		return 1
	}
	t := &smokeTest{ns: fmt.Sprintf("smoke-%d-%d", time.Now().Unix(), os.Getpid()), t0: time.Now()}
	ns := t.ns

	var version struct {
		Server struct{ GitVersion string } `json:"serverVersion"`
		Client struct{ GitVersion string } `json:"clientVersion"`
	}
	out, errOut, err := kubectl("", "version", "-o", "json")
	if err != nil || json.Unmarshal([]byte(out), &version) != nil {
		fmt.Fprint(os.Stderr, errOut)
		fmt.Fprintf(os.Stderr, "kube-smoke: kubectl version failed: %v\n", err)
		return 1
	}
	fmt.Printf("server %s, kubectl %s\n", version.Server.GitVersion, version.Client.GitVersion)
	t.must("", "create", "namespace", ns)
	t.log("namespace %s", ns)
	if realOnly {
		t.realNodesPart(realNodes)
		return t.end(ns, nil)
	}

	// ---- two kwok nodes: plain v1.Node objects, annotated so kwok manages them
	for _, n := range []string{"a", "b"} {
		t.must(fmt.Sprintf(`apiVersion: v1
kind: Node
metadata:
  name: %[1]s-node-%[2]s
  annotations:
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: %[1]s-node-%[2]s
    type: kwok
    trainyard.dev/pool: smoke
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
status:
  capacity:
    cpu: "32"
    memory: 256Gi
    pods: "110"
    nvidia.com/gpu: "8"
`, ns, n), "create", "-f", "-")
	}
	for _, n := range []string{"a", "b"} {
		node := ns + "-node-" + n
		t.waitUntil(30, "node "+node+" Ready", func() string {
			return lines(get("node", node, "-o",
				`jsonpath={.status.conditions[?(@.type=="Ready")].status} gpu={.status.allocatable.nvidia\.com/gpu}`),
				prefix("True"))
		})
	}

	// ---- PyTorchJobs through the real training operator
	t.pytorchJob("ok", 0)
	t.log("created PyTorchJob ok (master on node-a, worker on node-b, run-ms 3000)")
	t.waitUntil(60, "PyTorchJob ok Running", t.cond("pytorchjob", "ok", "Running"))
	t.printPods("training.kubeflow.org/job-name=ok")
	var placed []string
	for _, l := range strings.Split(t.podsOf("training.kubeflow.org/job-name=ok"), "\n") {
		if f := strings.Fields(l); len(f) >= 3 {
			placed = append(placed, f[0]+"@"+f[2])
		} else if len(f) > 0 {
			placed = append(placed, f[0]+"@")
		}
	}
	placedText := strings.Join(placed, " ") + " "
	master := strings.Index(placedText, "ok-master-0@"+ns+"-node-a")
	if master >= 0 && strings.Contains(placedText[master:], "ok-worker-0@"+ns+"-node-b") {
		t.log("ok: pods on the nodes their affinity names (%s)", placedText)
	} else {
		t.fail("placement: %s", placedText)
	}
	t.waitUntil(60, "PyTorchJob ok Succeeded", t.cond("pytorchjob", "ok", "Succeeded"))
	t.printPods("training.kubeflow.org/job-name=ok")

	t.pytorchJob("bad-exit", 3)
	t.log("created PyTorchJob bad-exit (exit-code 3)")
	t.waitUntil(60, "PyTorchJob bad-exit Failed", t.cond("pytorchjob", "bad-exit", "Failed"))
	if conds := get("-n", ns, "pytorchjob", "bad-exit", "-o",
		`jsonpath={range .status.conditions[*]}    {.type}={.status} {.reason}: {.message}{"\n"}{end}`); conds != "" {
		fmt.Println(conds)
	}
	// The job is Failed as soon as one of its pods is: the master's own end can come a moment later.
	code := ""
	for deadline := time.Now().Add(masterExitS * time.Second); code == "" && time.Now().Before(deadline); {
		if code = t.jget("pod", "bad-exit-master-0", "{.status.containerStatuses[0].state.terminated.exitCode}"); code == "" {
			time.Sleep(250 * time.Millisecond)
		}
	}
	if code == "3" {
		t.log("ok: master container exit code 3")
	} else {
		t.fail("master exit code '%s'", code)
	}

	// ---- schema validation by the real API server: 422
	status, msg := t.postRefused()
	if status == "422" {
		t.log("ok: replicas \"two\" refused with 422: %s", msg)
	} else {
		t.fail("bad PyTorchJob got HTTP %s: %s", status, msg)
	}

	// ---- RayJob through the real KubeRay operator
	t.must(fmt.Sprintf(`apiVersion: ray.io/v1
kind: RayJob
metadata:
  name: ray
  namespace: %s
  labels:
    sim.trainyard.dev/run-ms: "3000"
spec:
  entrypoint: python -c "print('hello')"
  submissionMode: HTTPMode
  shutdownAfterJobFinishes: true
  rayClusterSpec:
    headGroupSpec:
      rayStartParams: {}
      template:
        spec:
          containers:
          - name: ray-head
            image: example.invalid/trainyard/ray:smoke
            resources:
              limits: {cpu: "1", memory: 2Gi}
    workerGroupSpecs:
    - groupName: workers
      replicas: 1
      minReplicas: 1
      maxReplicas: 1
      rayStartParams: {}
      template:
        spec:
          containers:
          - name: ray-worker
            image: example.invalid/trainyard/ray:smoke
            resources:
              limits: {cpu: "1", memory: 2Gi}
`, ns), "create", "-f", "-")
	t.log("created RayJob ray (head + 1 worker, HTTPMode, run-ms 3000 read by the dashboard stand-in)")
	t.waitUntil(60, "RayJob ray has its RayCluster", func() string { return t.jget("rayjob", "ray", "{.status.rayClusterName}") })
	cluster := t.jget("rayjob", "ray", "{.status.rayClusterName}")
	t.waitUntil(60, "RayCluster "+cluster+" head and worker pods Running", func() string {
		n := 0
		for _, l := range strings.Split(t.podsOf("ray.io/cluster="+cluster), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[1] == "Running" {
				n++
			}
		}
		if n >= 2 {
			return fmt.Sprintf("%d pods Running", n)
		}
		return ""
	})
	t.printPods("ray.io/cluster=" + cluster)
	t.waitUntil(60, "RayCluster "+cluster+" state ready", func() string {
		return lines(t.jget("raycluster", cluster, "{.status.state}"), exactly("ready"))
	})
	rayJobStatus := func() string { return t.jget("rayjob", "ray", "{.status.jobDeploymentStatus}/{.status.jobStatus}") }
	t.waitUntil(60, "RayJob ray Running/RUNNING", func() string { return lines(rayJobStatus(), exactly("Running/RUNNING")) })
	t.waitUntil(60, "RayJob ray Complete/SUCCEEDED", func() string { return lines(rayJobStatus(), exactly("Complete/SUCCEEDED")) })
	t.log("RayJob status: %s %s", rayJobStatus(), t.jget("rayjob", "ray", "{.status.message}"))
	t.waitUntil(60, "RayCluster "+cluster+" removed after the job (shutdownAfterJobFinishes)", gone("-n", ns, "raycluster", cluster))

	// ---- Kueue, when the stack runs it (as scripts/with-kube does unless --without-kueue): a suspended
	// PyTorchJob with a queue-name label gets a Workload, is admitted and un-suspended, then runs and succeeds.
	if _, _, err := kubectl("", "get", "crd", "clusterqueues.kueue.x-k8s.io"); err == nil {
		t.must(fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: smoke-%[1]s
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: smoke-%[1]s
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: ["cpu", "nvidia.com/gpu"]
    flavors:
    - name: smoke-%[1]s
      resources:
      - name: cpu
        nominalQuota: "64"
      - name: nvidia.com/gpu
        nominalQuota: "16"
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: smoke
  namespace: %[1]s
spec:
  clusterQueue: smoke-%[1]s
`, ns), "apply", "--server-side", "-f", "-")
		t.must(fmt.Sprintf(`apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: queued
  namespace: %s
  labels:
    kueue.x-k8s.io/queue-name: smoke
spec:
  runPolicy:
    suspend: true
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: Never
      template:
        metadata:
          labels:
            sim.trainyard.dev/run-ms: "1000"
        spec:
          containers:
          - name: pytorch
            image: example.invalid/trainyard/pytorch:smoke
            resources:
              requests: {cpu: "1"}
              limits: {nvidia.com/gpu: "1"}
`, ns), "create", "-f", "-")
		t.log("created suspended PyTorchJob queued (Kueue LocalQueue smoke)")
		t.waitUntil(60, "Kueue admitted the Workload of queued", func() string {
			return lines(get("-n", ns, "workloads", "-o",
				`jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type=="Admitted")].status}{"\n"}{end}`),
				func(l string) bool { return strings.HasSuffix(l, " True") })
		})
		t.waitUntil(60, "PyTorchJob queued un-suspended and Succeeded", t.cond("pytorchjob", "queued", "Succeeded"))
		t.must("", "delete", "clusterqueue", "smoke-"+ns, "--wait=false")
		t.must("", "delete", "resourceflavor", "smoke-"+ns, "--wait=false")
	}

	// ---- the other sim labels on bare pods: OOM and image pull errors
	t.barePod("oom", `"sim.trainyard.dev/run-ms": "500", "sim.trainyard.dev/oom": "true"`)
	t.barePod("pull", `"sim.trainyard.dev/pull-error": "true"`)
	t.barePod("forever", "")
	t.waitUntil(30, "pod oom Failed, OOMKilled 137", func() string {
		return lines(t.jget("pod", "oom", "{.status.phase} {.status.containerStatuses[0].state.terminated.reason} "+
			"{.status.containerStatuses[0].state.terminated.exitCode}"), exactly("Failed OOMKilled 137"))
	})
	t.waitUntil(30, "pod pull ImagePullBackOff", func() string {
		return lines(t.jget("pod", "pull", "{.status.phase} {.status.containerStatuses[0].state.waiting.reason}"),
			exactly("Pending ImagePullBackOff"))
	})
	t.waitUntil(30, "pod forever Running", func() string {
		return lines(t.jget("pod", "forever", "{.status.phase} {.status.podIP}"), prefix("Running"))
	})

	// ---- the pod network: a container's log through the API server (kwok's kubelet server, reached through the
	// "cluster" egress), and the pod proxy to a simulated pod's port
	t.waitUntil(30, "pod forever's log through the API server", func() string {
		out, _, _ := kubectl("", "-n", ns, "logs", "forever", "--timestamps")
		return lines(out, contains("2026-01-01T00:00:01.000000000Z simulated container: step 1"))
	})
	t.waitUntil(30, "pod forever's :9100/metrics through the pod proxy", func() string {
		out, _, _ := kubectl("", "get", "--raw", "/api/v1/namespaces/"+ns+"/pods/forever:9100/proxy/metrics")
		return lines(out, contains(`sim_pod_up{pod="forever",port="9100",path="/metrics"} 1`))
	})

	// ---- node NotReady by label, and back
	nodeB := ns + "-node-b"
	t.must("", "label", "node", nodeB, "sim.trainyard.dev/not-ready=true")
	t.waitUntil(30, "node-b NotReady", func() string {
		return lines(get("node", nodeB, "-o",
			`jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].reason}`),
			prefix("False"))
	})
	t.must("", "label", "node", nodeB, "sim.trainyard.dev/not-ready-")
	t.waitUntil(30, "node-b Ready again", func() string {
		return lines(get("node", nodeB, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`), exactly("True"))
	})

	// ---- real nodes, when the stack has them (with-kube --real-nodes 2)
	switch len(realNodes) {
	case 0:
		t.log("no real nodes (with-kube --real-nodes 2 adds their part)")
	case 1:
		t.log("one real node only: its part needs two (with-kube --real-nodes 2)")
	default:
		t.realNodesPart(realNodes)
	}

	// ---- graceful deletion is observable; garbage collection of a job's pods; namespace deletion
	t.must("", "-n", ns, "delete", "pod", "forever", "--wait=false")
	t.waitUntil(5, "pod forever seen terminating", func() string { return t.jget("pod", "forever", "{.metadata.deletionTimestamp}") })
	t.waitUntil(30, "pod forever removed", gone("-n", ns, "pod", "forever"))
	t.must("", "-n", ns, "delete", "pytorchjob", "ok", "--wait=false")
	t.waitUntil(60, "PyTorchJob ok's pods garbage-collected", func() string {
		out, _, err := kubectl("", "-n", ns, "get", "pods", "-l", "training.kubeflow.org/job-name=ok", "-o", "name")
		if err == nil && strings.TrimSpace(out) == "" {
			return "gone"
		}
		return ""
	})
	return t.end(ns, []string{ns + "-node-a", nodeB})
}

// end deletes the namespace (and the kwok nodes) and says how the test went.
func (t *smokeTest) end(ns string, nodes []string) int {
	t.must("", "delete", "namespace", ns, "--wait=false")
	t.waitUntil(120, "namespace "+ns+" deleted with everything in it", gone("namespace", ns))
	if len(nodes) > 0 {
		t.must("", append([]string{"delete", "node"}, nodes...)...)
	}
	if t.failures > 0 {
		t.log("%d check(s) failed", t.failures)
		return 1
	}
	t.log("all checks passed")
	return 0
}

// postRefused POSTs a PyTorchJob the CRD's schema refuses (replicas "two") with the admin's credentials from the
// kubeconfig, and returns the HTTP status ("000" when there was no answer) and the answer's message.
func (t *smokeTest) postRefused() (string, string) {
	view := func(path string) string {
		return strings.TrimSpace(kubectlOut("config", "view", "--raw", "-o", "jsonpath="+path))
	}
	token, server, caFile := view("{.users[0].user.token}"), view("{.clusters[0].cluster.server}"),
		view("{.clusters[0].cluster.certificate-authority}")
	pool := x509.NewCertPool()
	if ca, err := os.ReadFile(caFile); err == nil {
		pool.AppendCertsFromPEM(ca)
	}
	client := &http.Client{Timeout: 30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, Proxy: nil}}
	body := `{"apiVersion":"kubeflow.org/v1","kind":"PyTorchJob","metadata":{"name":"refused"},"spec":{"pytorchReplicaSpecs":{"Master":{"replicas":"two","template":{"spec":{"containers":[{"name":"pytorch","image":"x"}]}}}}}}`
	req, err := http.NewRequest(http.MethodPost, server+"/apis/kubeflow.org/v1/namespaces/"+t.ns+"/pytorchjobs",
		strings.NewReader(body))
	if err != nil {
		return "000", err.Error()
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "000", err.Error()
	}
	defer resp.Body.Close()
	var answer struct{ Message *string }
	msg := "null"
	if json.NewDecoder(resp.Body).Decode(&answer) == nil && answer.Message != nil {
		msg = *answer.Message
	}
	return fmt.Sprint(resp.StatusCode), msg
}

// kubectlOut is kubectl's output without a subcommand added ("" on an error).
func kubectlOut(args ...string) string {
	out, _, err := kubectl("", args...)
	if err != nil {
		return ""
	}
	return out
}
