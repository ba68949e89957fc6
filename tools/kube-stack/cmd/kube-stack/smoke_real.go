package main

// The smoke test's part on real nodes (run when the stack has at least two: with-kube --real-nodes 2): real
// containers from the local registry's base image, on real-0 and real-1.
//
//   - pod b on real-1 serves a line over HTTP on 8080 (nc) behind a headless Service (srv-b) and a ClusterIP one
//     (srv-b-vip); pod a on real-0 has an init container that writes a file its main container then reads, and
//     reaches b by IP, by the Service's DNS names (srv-b.<ns>.svc.cluster.local, the short srv-b), by the pod's
//     own name under the Service (b.srv-b...), and through the ClusterIP (kube-proxy); `kubectl logs a` shows
//     what it printed, `kubectl exec` runs a command in it; the API server's pod proxy reaches b;
//   - a PyTorchJob's master (the training operator's pod, the base image) on a real node sees MASTER_ADDR and
//     resolves the operator's headless Service for it by DNS to its own IP;
//   - a pod whose container exits 7 shows exit code 7 in its status;
//   - deleting a pod with a preStop hook and a 4 s grace period: the hook runs before the TERM, a container that
//     handles TERM ends on its own, one that ignores it is killed when the grace period ends (the events are
//     written to a hostPath dir in the stack's dir, read here after the pod is gone).

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const realGraceS = 4

func (t *smokeTest) realNodesPart(nodes []string) {
	ns := t.ns
	base := os.Getenv("TRAINYARD_KUBE_BASE_IMAGE")
	if base == "" {
		t.fail("TRAINYARD_KUBE_BASE_IMAGE is not set")
		return
	}
	n0, n1 := nodes[0], nodes[1]
	for _, n := range []string{n0, n1} {
		info := get("node", n, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status} `+
			`{.metadata.labels.trainyard\.dev/real} {.status.nodeInfo.kubeletVersion} {.status.nodeInfo.containerRuntimeVersion} `+
			`{.status.addresses[?(@.type=="InternalIP")].address}`)
		if strings.HasPrefix(info, "True true ") {
			t.log("ok: real node %s Ready (ready, label, kubelet, runtime, InternalIP: %s)", n, info)
		} else {
			t.fail("real node %s: %q", n, info)
		}
	}
	toleration := `
  tolerations:
  - key: trainyard.dev/real
    operator: Exists
    effect: NoSchedule`

	// ---- pod b on the second node, behind a headless Service and a ClusterIP one
	// b answers every HTTP request on 8080 with the body "hello from b", after reading the request's head (an
	// answer sent before it would reach the API server's proxy ahead of its request).
	serveB := `echo "b serving on $(hostname -i):8080"
body="hello from $(hostname)"
rm -f /tmp/answer && mkfifo /tmp/answer
while true; do
  cat /tmp/answer | nc -l -N 8080 | {
    while read -r line; do line=${line%$'\r'}; [ -z "$line" ] && break; done
    printf 'HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s\n' $((${#body} + 1)) "$body" > /tmp/answer
  }
done`
	t.must(fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: srv-b
  namespace: %[1]s
spec:
  clusterIP: None
  selector: {app: srv-b}
  ports:
  - port: 8080
---
apiVersion: v1
kind: Service
metadata:
  name: srv-b-vip
  namespace: %[1]s
spec:
  selector: {app: srv-b}
  ports:
  - port: 80
    targetPort: 8080
---
apiVersion: v1
kind: Pod
metadata:
  name: b
  namespace: %[1]s
  labels: {app: srv-b}
spec:
  hostname: b
  subdomain: srv-b
  nodeSelector: {kubernetes.io/hostname: %[2]s}%[4]s
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: serve
    image: %[3]s
    command: ["bash", "-c", %[5]s]
`, ns, n1, base, toleration, strconv.Quote(serveB)), "create", "-f", "-")
	t.log("created pod b on %s (nc on 8080) behind Services srv-b (headless) and srv-b-vip", n1)
	t.waitUntil(120, "pod b Running on "+n1, func() string {
		return lines(t.jget("pod", "b", "{.status.phase} {.spec.nodeName} {.status.podIP}"), prefix("Running "+n1+" 10.244."))
	})
	bIP := t.jget("pod", "b", "{.status.podIP}")
	vip := t.jget("service", "srv-b-vip", "{.spec.clusterIP}")

	// ---- pod a on the first node: an init container, then the checks
	script := `echo "main sees: $(cat /work/init.txt)"
try() { for i in $(seq 1 20); do out=$(printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 2 "$1" "$2" | tail -n 1) && [ -n "$out" ] && { echo "$3 -> $out"; return 0; }; sleep 0.5; done; echo "$3 -> FAILED"; return 1; }
echo "resolv: $(grep -E '^(nameserver|search)' /etc/resolv.conf | tr '\n' ' ')"
echo "getent srv-b.$NS.svc.cluster.local: $(getent hosts srv-b.$NS.svc.cluster.local)"
echo "getent srv-b: $(getent hosts srv-b)"
echo "getent b.srv-b: $(getent hosts b.srv-b)"
try "$B_IP" 8080 "by IP $B_IP"
try srv-b.$NS.svc.cluster.local 8080 "by name srv-b.$NS.svc.cluster.local"
try srv-b 8080 "by short name srv-b"
try b.srv-b 8080 "by pod name b.srv-b"
try "$VIP" 80 "by ClusterIP $VIP:80"
echo "a done"
sleep 3600`
	t.must(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: a
  namespace: %[1]s
spec:
  nodeSelector: {kubernetes.io/hostname: %[2]s}%[4]s
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  volumes:
  - name: work
    emptyDir: {}
  initContainers:
  - name: init
    image: %[3]s
    command: ["bash", "-c", "echo \"init ran at $(date +%%s.%%N)\" | tee /work/init.txt"]
    volumeMounts: [{name: work, mountPath: /work}]
  containers:
  - name: main
    image: %[3]s
    command: ["bash", "-c", %[5]s]
    env:
    - {name: NS, value: %[1]s}
    - {name: B_IP, value: "%[6]s"}
    - {name: VIP, value: "%[7]s"}
    volumeMounts: [{name: work, mountPath: /work}]
`, ns, n0, base, toleration, strconv.Quote(script), bIP, vip), "create", "-f", "-")
	t.log("created pod a on %s (init container, then the network checks against b at %s, ClusterIP %s)", n0, bIP, vip)
	t.waitUntil(120, "pod a's checks done (its log through the API server and its kubelet)", func() string {
		out, _, _ := kubectl("", "-n", ns, "logs", "a", "-c", "main")
		return lines(out, exactly("a done"))
	})
	logA, _, _ := kubectl("", "-n", ns, "logs", "a", "-c", "main")
	for _, l := range strings.Split(strings.TrimRight(logA, "\n"), "\n") {
		fmt.Println("    a| " + l)
	}
	for _, want := range []string{"main sees: init ran at ", "by IP " + bIP + " -> hello from b",
		"by name srv-b." + ns + ".svc.cluster.local -> hello from b", "by short name srv-b -> hello from b",
		"by pod name b.srv-b -> hello from b", "by ClusterIP " + vip + ":80 -> hello from b"} {
		if lines(logA, prefix(want)) != "" {
			t.log("ok: a's log has %q", want)
		} else {
			t.fail("a's log lacks %q", want)
		}
	}
	if l := lines(logA, prefix("getent srv-b."+ns+".svc.cluster.local: "+bIP+" ")); l != "" {
		t.log("ok: the headless Service's name resolves to pod b's IP (%s)", l)
	} else {
		t.fail("srv-b.%s.svc.cluster.local did not resolve to %s", ns, bIP)
	}
	initLog, _, _ := kubectl("", "-n", ns, "logs", "a", "-c", "init")
	fmt.Println("    a/init| " + strings.TrimSpace(initLog))
	initEnd := t.jget("pod", "a", "{.status.initContainerStatuses[0].state.terminated.reason} {.status.initContainerStatuses[0].state.terminated.finishedAt}")
	mainStart := t.jget("pod", "a", "{.status.containerStatuses[0].state.running.startedAt}")
	f := strings.Fields(initEnd)
	if len(f) == 2 && f[0] == "Completed" && mainStart != "" && f[1] <= mainStart {
		t.log("ok: init container Completed at %s, main started at %s", f[1], mainStart)
	} else {
		t.fail("init container %q, main started %q", initEnd, mainStart)
	}
	// the API server's pod proxy: through its "cluster" egress (the stack's router) to the pod's address
	if out, errOut, err := kubectl("", "get", "--raw", "/api/v1/namespaces/"+ns+"/pods/b:8080/proxy/"); err == nil &&
		strings.TrimSpace(out) == "hello from b" {
		t.log("ok: pod b's :8080 through the API server's pod proxy (%s)", strings.TrimSpace(out))
	} else {
		t.fail("pod proxy to b:8080: %v %q %q", err, out, errOut)
	}
	// exec: API server -> kubelet -> containerd's stream server
	if out, errOut, err := kubectl("", "-n", ns, "exec", "a", "-c", "main", "--", "bash", "-c", "echo exec in $HOSTNAME: $(cat /work/init.txt)"); err == nil &&
		strings.HasPrefix(out, "exec in a: init ran at ") {
		t.log("ok: kubectl exec: %s", strings.TrimSpace(out))
	} else {
		t.fail("kubectl exec a: %v %q %q", err, out, errOut)
	}
	bLog, _, _ := kubectl("", "-n", ns, "logs", "b")
	if l := lines(bLog, prefix("b serving on "+bIP)); l != "" {
		t.log("ok: b's log: %s", l)
	} else {
		t.fail("b's log: %q", bLog)
	}

	// ---- the training operator's headless Service for a replica (MASTER_ADDR) from inside a real container
	ptScript := `echo "MASTER_ADDR=$MASTER_ADDR WORLD_SIZE=$WORLD_SIZE RANK=$RANK"
fqdn=$MASTER_ADDR.$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace).svc.cluster.local
for i in $(seq 1 20); do out=$(getent hosts "$fqdn") && break; sleep 0.5; done
echo "dns: $out"`
	t.must(fmt.Sprintf(`apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata:
  name: real-pt
  namespace: %[1]s
spec:
  runPolicy:
    backoffLimit: 0
  pytorchReplicaSpecs:
    Master:
      replicas: 1
      restartPolicy: Never
      template:
        spec:
          nodeSelector: {kubernetes.io/hostname: %[2]s}
          tolerations:
          - key: trainyard.dev/real
            operator: Exists
            effect: NoSchedule
          containers:
          - name: pytorch
            image: %[3]s
            command: ["bash", "-c", %[4]s]
`, ns, n1, base, strconv.Quote(ptScript)), "create", "-f", "-")
	t.log("created PyTorchJob real-pt (master on %s, base image: prints MASTER_ADDR and resolves its Service's name)", n1)
	t.waitUntil(90, "PyTorchJob real-pt Succeeded", t.cond("pytorchjob", "real-pt", "Succeeded"))
	ptLog, _, _ := kubectl("", "-n", ns, "logs", "real-pt-master-0")
	for _, l := range strings.Split(strings.TrimRight(ptLog, "\n"), "\n") {
		fmt.Println("    real-pt-master-0| " + l)
	}
	ptIP := t.jget("pod", "real-pt-master-0", "{.status.podIP}")
	if lines(ptLog, prefix("MASTER_ADDR=real-pt-master-0 ")) != "" && ptIP != "" &&
		lines(ptLog, prefix("dns: "+ptIP+" ")) != "" {
		t.log("ok: MASTER_ADDR real-pt-master-0, its headless Service's name resolves (DNS) to the master's IP %s", ptIP)
	} else {
		t.fail("real-pt: master IP %q, log %q", ptIP, ptLog)
	}

	// ---- an exit code
	t.must(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: exit7
  namespace: %[1]s
spec:
  nodeSelector: {kubernetes.io/hostname: %[2]s}%[4]s
  restartPolicy: Never
  containers:
  - name: main
    image: %[3]s
    command: ["bash", "-c", "echo about to exit 7; exit 7"]
`, ns, n1, base, toleration), "create", "-f", "-")
	t.waitUntil(60, "pod exit7 Failed with exit code 7", func() string {
		return lines(t.jget("pod", "exit7", "{.status.phase} {.status.containerStatuses[0].state.terminated.reason} "+
			"{.status.containerStatuses[0].state.terminated.exitCode}"), exactly("Failed Error 7"))
	})

	// ---- preStop and the grace period
	events := filepath.Join(os.Getenv("TRAINYARD_KUBE_STACK"), "smoke-real", ns)
	if err := os.MkdirAll(events, 0o777); err != nil {
		t.fail("%v", err)
		return
	}
	t.must(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: graceful
  namespace: %[1]s
spec:
  nodeSelector: {kubernetes.io/hostname: %[2]s}%[4]s
  restartPolicy: Never
  terminationGracePeriodSeconds: %[6]d
  volumes:
  - name: events
    hostPath: {path: %[5]s, type: Directory}
  containers:
  - name: handles-term
    image: %[3]s
    command: ["bash", "-c", "trap 'echo \"handles-term: TERM $(date +%%s.%%N)\" >> /events/log; sleep 1; echo \"handles-term: exit $(date +%%s.%%N)\" >> /events/log; exit 0' TERM; echo \"handles-term: started $(date +%%s.%%N)\" >> /events/log; while true; do sleep 0.1; done"]
    volumeMounts: [{name: events, mountPath: /events}]
    lifecycle:
      preStop:
        exec:
          command: ["bash", "-c", "echo \"handles-term: preStop $(date +%%s.%%N)\" >> /events/log; sleep 1"]
  - name: ignores-term
    image: %[3]s
    command: ["bash", "-c", "trap '' TERM; echo \"ignores-term: started $(date +%%s.%%N)\" >> /events/log; while true; do sleep 0.1; done"]
    volumeMounts: [{name: events, mountPath: /events}]
`, ns, n0, base, toleration, events, realGraceS), "create", "-f", "-")
	t.waitUntil(60, "pod graceful Running, both containers started", func() string {
		data, _ := os.ReadFile(filepath.Join(events, "log"))
		if t.jget("pod", "graceful", "{.status.phase}") == "Running" && strings.Count(string(data), "started") == 2 {
			return "Running"
		}
		return ""
	})
	deleted := time.Now()
	t.must("", "-n", ns, "delete", "pod", "graceful", "--wait=false")
	// Until it is gone: the deletion deadline (deletionTimestamp: the delete + the grace period) and the
	// containers' ends as the kubelet reported them.
	deadline, ends := "", map[string]string{}
	t.waitUntil(30, "pod graceful removed", func() string {
		out, errOut, err := kubectl("", "-n", ns, "get", "pod", "graceful", "-o", `jsonpath={.metadata.deletionTimestamp}`+
			`{range .status.containerStatuses[*]}{"\n"}{.name} {.state.terminated.exitCode} {.state.terminated.finishedAt}{end}`)
		if err != nil {
			if strings.Contains(errOut, "NotFound") {
				return "gone"
			}
			return ""
		}
		ls := strings.Split(out, "\n")
		deadline = ls[0]
		for _, l := range ls[1:] {
			if f := strings.Fields(l); len(f) == 3 {
				ends[f[0]] = f[1] + " " + f[2]
			}
		}
		return ""
	})
	took := time.Since(deleted).Seconds()
	data, _ := os.ReadFile(filepath.Join(events, "log"))
	for _, l := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		fmt.Println("    graceful| " + l)
	}
	ev := map[string]float64{}
	for _, l := range strings.Split(string(data), "\n") {
		if f := strings.Fields(l); len(f) == 3 {
			v, _ := strconv.ParseFloat(f[2], 64)
			ev[f[0]+" "+f[1]] = v
		}
	}
	pre, term, exit := ev["handles-term: preStop"], ev["handles-term: TERM"], ev["handles-term: exit"]
	if pre > 0 && term >= pre+0.9 && exit >= term+0.9 {
		t.log("ok: preStop ran, then TERM %.1f s later (after the hook), the container exited on its own %.1f s after TERM", term-pre, exit-term)
	} else {
		t.fail("preStop/TERM/exit times: %v", ev)
	}
	// The one that ignores TERM is killed (137) when the grace period ends, counted from when the kubelet began
	// to stop the pod (the preStop hook's start; the API's deletionTimestamp is the delete's time + the grace
	// period, and the kubelet learns of the delete a moment later). The API's times are whole seconds.
	killed := strings.Fields(ends["ignores-term"])
	var at time.Time
	var errK error = fmt.Errorf("no end seen")
	if len(killed) == 2 {
		at, errK = time.Parse(time.RFC3339, killed[1])
	}
	due := pre + realGraceS
	if errK == nil && killed[0] == "137" && pre > 0 && float64(at.Unix()) >= due-1 && float64(at.Unix()) <= due+2 {
		stamp := func(f float64) string {
			return time.Unix(0, int64(f*1e9)).UTC().Format("15:04:05.000")
		}
		t.log("ok: ignores-term killed (exit 137) at %s (whole seconds); the preStop hook began at %s, + %d s grace "+
			"= %s; handles-term ended with %s; deletionTimestamp %s; pod gone %.1f s after the delete",
			killed[1], stamp(pre), realGraceS, stamp(due), ends["handles-term"], deadline, took)
	} else {
		t.fail("grace period %d s: preStop at %.1f, containers' ends %v, deletionTimestamp %s, pod gone %.1f s after the delete",
			realGraceS, pre, ends, deadline, took)
	}
	t.must("", "-n", ns, "delete", "pod", "a", "b", "exit7", "--wait=false")
	t.waitUntil(60, "real pods a, b, exit7 removed", func() string {
		out, _, err := kubectl("", "-n", ns, "get", "pods", "a", "b", "exit7", "--ignore-not-found", "-o", "name")
		if err == nil && strings.TrimSpace(out) == "" {
			return "gone"
		}
		return ""
	})
}
