package main

// Real nodes (with-kube --real-nodes N): besides kwok's simulated nodes, N kubelets on this machine, real-0 ...
// real-<N-1>, each with its own containerd (Debian's, with runc), that run real containers:
//
//   - node i's pods get addresses in 10.244.i.0/24 on a bridge of its own (tykr<i>, gateway 10.244.i.1, made
//     here before the CNI bridge plugin finds it); the bridges are on this machine, so the host's routes join
//     them. The kubelet serves on the gateway address (its InternalIP), which the API server reaches through
//     the egress router below.
//   - each node's containerd and kubelet share a mount namespace of their own (unshare): a tmpfs on /run
//     (containerd's shim sockets, runc's state, the pods' network namespaces), one on /var/lib (the paths the
//     kubelet keeps under /var/lib/kubelet whatever its --root-dir: device-plugins/), the node's own dir on
//     /var/log (the kubelet's /var/log/containers), and the six kernel settings the kubelet would otherwise change on
//     the host (vm.overcommit_memory, kernel.panic, ...) shown to it as files holding the values it wants
//     (protectKernelDefaults: it only reads them). When the node's last process ends, its mounts go with it.
//   - every process of the real nodes runs in the stack's cgroup, /trainyard-kube-real.<stack>, in every
//     cgroup v1 hierarchy: services/ (registry, CoreDNS, kube-proxy) and, per node, real-<i>/ (the kubelet's
//     cgroupRoot, kubepods/ below it), real-<i>/runtime/ (containerd and its shims), real-<i>/kubelet/.
//     Stopping the stack kills whatever is left in it (the containers) and removes it.
//   - one kube-proxy (nftables mode; its tables "kube-proxy" are removed when the stack stops) and one CoreDNS
//     (a host process on every gateway address, port 53, with the kubernetes plugin against the API server).
//   - one kube-router with its NetworkPolicy controller alone, enforcing NetworkPolicies for the pods of real-0
//     (see startNetpol; its iptables rules and ipsets are removed when the stack stops).
//   - a private registry beside it (a second docker-registry, its own storage) that answers only with a login
//     (basic auth, user trainyard and a password made for the stack), for images pulled with imagePullSecrets;
//   - a registry (Debian's docker-registry) on 127.0.0.1, plain http, that every containerd pulls from; the
//     pause image (tools/kube-stack/nodes/pause, built static) and a base image (bash, coreutils, grep, sed,
//     hostname, nc, getent:
//     Debian's files from this machine) are built and pushed into it at start (see image.go).
//
// Real nodes are labelled trainyard.dev/real=true and tainted trainyard.dev/real=true:NoSchedule, so only pods
// that tolerate the taint land there (a test's kwok pods never do by accident); kwok manages only the nodes
// annotated kwok.x-k8s.io/node=fake, so never these. One stack with real nodes runs on a machine at a time
// (their bridges, addresses and kube-proxy's tables are the machine's): a second one waits for the lock
// /run/lock/trainyard-kube-real-nodes.lock; what a stack killed with -9 left behind (the processes in its
// cgroup, the cgroup, bridges, kube-proxy's tables) is removed by the next one that takes the lock.

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	maxRealNodes     = 8
	realClusterCIDR  = "10.244.0.0/16"
	realBridgePrefix = "tykr"
	realCgroupPrefix = "trainyard-kube-real."
	realLockPath     = "/run/lock/trainyard-kube-real-nodes.lock"
	realLabel        = "trainyard.dev/real"
	realNodeReadyS   = 120
	registryReadyS   = 30
	containerdReadyS = 60
	corednsReadyS    = 60
	baseImagePkgs    = "bash,coreutils,grep,sed,hostname,netcat-openbsd,libc-bin"
)

// The kernel settings the kubelet checks (and would set, without protectKernelDefaults) and the values it wants:
// k8s.io/component-helpers/node/util/sysctl's VMOvercommitMemoryAlways, VMPanicOnOOMInvokeOOMKiller,
// KernelPanicRebootTimeout, KernelPanicOnOopsAlways, RootMaxKeysSetting, RootMaxBytesSetting.
var kubeletSysctls = []struct{ name, value string }{
	{"vm/overcommit_memory", "1"},
	{"vm/panic_on_oom", "0"},
	{"kernel/panic", "10"},
	{"kernel/panic_on_oops", "1"},
	{"kernel/keys/root_maxkeys", "1000000"},
	{"kernel/keys/root_maxbytes", "25000000"},
}

type realNode struct {
	name, dir            string
	podCIDR, gateway     string
	bridge               string
	cgroup               string // the kubelet's cgroupRoot, e.g. /trainyard-kube-real.123/real-0
	kubeletPort, healthz int
	token                string
	containerdSock       string
	containerdPid        int
}

type realNodes struct {
	s         *stack
	dir       string
	lock      *os.File
	nodes     []*realNode
	registry  string // 127.0.0.1:PORT
	private   string // 127.0.0.1:PORT, the registry that needs a login
	privPass  string // user trainyard's password there
	initRef   string // the training operator's init container image for workers
	pauseRef  string
	baseRef   string
	proxyTok  string
	dnsTok    string
	dnsHealth int
	dnsReady  int
	proxyPort [2]int // healthz, metrics
	router    net.Listener
	apiFwd    net.Listener // the API server for pods (startAPIForwarder)
	cgroup    string       // the stack's, e.g. /trainyard-kube-real.123
	cleaned   bool
}

func (rn *realNodes) names() []string {
	var out []string
	for _, n := range rn.nodes {
		out = append(out, n.name)
	}
	return out
}

// ---- preparation, before the API server starts: the lock, leftovers, dirs, bridges, cgroups, tokens, certs

func (s *stack) prepareRealNodes() error {
	if os.Geteuid() != 0 {
		return die("--real-nodes needs root (bridges, cgroups, mount namespaces)")
	}
	for _, tool := range []string{"containerd", "containerd-shim-runc-v2", "runc", "docker-registry", "nft", "ip", "unshare", "nsenter", "mount", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			return die("--real-nodes needs %s (scripts/install-deps test installs it): %v", tool, err)
		}
	}
	rn := &realNodes{s: s, dir: s.path("nodes"), cgroup: "/" + realCgroupPrefix + strings.TrimPrefix(filepath.Base(s.dir), "trainyard-kube.")}
	s.nodes = rn
	if err := rn.takeLock(); err != nil {
		return err
	}
	removeLeftovers()
	ports, err := freePorts(2*s.realNodes + 6)
	if err != nil {
		return err
	}
	for i := 0; i < s.realNodes; i++ {
		n := &realNode{
			name:    fmt.Sprintf("real-%d", i),
			podCIDR: fmt.Sprintf("10.244.%d.0/24", i),
			gateway: fmt.Sprintf("10.244.%d.1", i),
			bridge:  fmt.Sprintf("%s%d", realBridgePrefix, i),
			cgroup:  fmt.Sprintf("%s/real-%d", rn.cgroup, i),
			token:   token(),
		}
		n.kubeletPort, n.healthz = ports[2*i], ports[2*i+1]
		n.dir = filepath.Join(rn.dir, n.name)
		n.containerdSock = filepath.Join(n.dir, "containerd.sock")
		rn.nodes = append(rn.nodes, n)
	}
	p := ports[2*s.realNodes:]
	rn.registry = "127.0.0.1:" + strconv.Itoa(p[0])
	rn.private, rn.privPass = "127.0.0.1:"+strconv.Itoa(p[5]), token()
	rn.dnsHealth, rn.dnsReady, rn.proxyPort = p[1], p[2], [2]int{p[3], p[4]}
	rn.proxyTok, rn.dnsTok = token(), token()
	rn.pauseRef = rn.registry + "/trainyard/pause:1"
	rn.baseRef = rn.registry + "/trainyard/base:1"
	rn.initRef = rn.registry + "/trainyard/init-pytorch:1"

	if err := makeCgroups(rn.cgroup, rn.cgroup+"/services"); err != nil {
		return die("cgroup %s: %v", rn.cgroup, err)
	}
	for _, n := range rn.nodes {
		for _, d := range []string{"containerd", "kubelet", "pod-logs", "varlog", "cni", "ipam", "sysctl", "volume-plugins", "certs.d"} {
			if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
				return err
			}
		}
		if err := makeBridge(n.bridge, n.gateway+"/24"); err != nil {
			return die("bridge %s: %v", n.bridge, err)
		}
		if err := makeCgroups(n.cgroup, n.cgroup+"/runtime", n.cgroup+"/kubelet"); err != nil {
			return die("cgroup %s: %v", n.cgroup, err)
		}
	}
	if err := writeClientCert(s.pki, "kubelet-client", "kube-apiserver-kubelet-client", "system:masters"); err != nil {
		return die("the API server's kubelet client certificate: %v", err)
	}
	return rn.startEgressRouter()
}

// tokenLines: the nodes' users for the static token file.
func (rn *realNodes) tokenLines() string {
	var b strings.Builder
	for _, n := range rn.nodes {
		fmt.Fprintf(&b, "%s,system:node:%s,uid-node-%s,\"system:nodes\"\n", n.token, n.name, n.name)
	}
	fmt.Fprintf(&b, "%s,system:kube-proxy,uid-kube-proxy\n", rn.proxyTok)
	fmt.Fprintf(&b, "%s,trainyard:coredns,uid-coredns\n", rn.dnsTok)
	return b.String()
}

// apiServerFlags: the API server's client certificate for kubelets (logs, exec: they check it against the CA).
func (rn *realNodes) apiServerFlags() []string {
	pki := rn.s.pki
	return []string{"--kubelet-client-certificate=" + filepath.Join(pki, "kubelet-client.crt"),
		"--kubelet-client-key=" + filepath.Join(pki, "kubelet-client.key")}
}

// takeLock: one stack with real nodes per machine; a second one waits (or stops on INT/TERM).
func (rn *realNodes) takeLock() error {
	f, err := os.OpenFile(realLockPath, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return die("the real nodes' lock %s: %v", realLockPath, err)
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return die("locking %s: %v", realLockPath, err)
		}
		if !said {
			data, _ := os.ReadFile(realLockPath)
			say("waiting for another stack with real nodes to stop (lock %s, held by %s)", realLockPath, strings.TrimSpace(string(data)))
			said = true
		}
		select {
		case <-rn.s.ctx.Done():
			f.Close()
			return errSignalled
		case <-time.After(500 * time.Millisecond):
		}
	}
	f.Truncate(0)
	f.WriteAt([]byte(fmt.Sprintf("pid %d, %s\n", os.Getpid(), rn.s.dir)), 0)
	rn.lock = f
	return nil
}

// ---- the machine's state: bridges, cgroups, nftables

func runQuiet(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func makeBridge(name, addr string) error {
	if err := runQuiet("ip", "link", "add", name, "type", "bridge"); err != nil {
		return err
	}
	if err := runQuiet("ip", "addr", "add", addr, "dev", name); err != nil {
		return err
	}
	return runQuiet("ip", "link", "set", name, "up")
}

// cgroupMounts: the mount points of the cgroup v1 hierarchies (and of the v2 one, in hybrid mode).
func cgroupMounts() (v1 []string, v2 string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		switch fields[sep+1] {
		case "cgroup":
			v1 = append(v1, fields[4])
		case "cgroup2":
			v2 = fields[4]
		}
	}
	sort.Strings(v1)
	return v1, v2
}

// makeCgroups creates cgroups (parents first) in every v1 hierarchy (cpuset's get their parent's cpus and mems,
// as a new cpuset starts with none).
func makeCgroups(paths ...string) error {
	v1, _ := cgroupMounts()
	if len(v1) == 0 {
		return fmt.Errorf("no cgroup v1 hierarchy mounted (real nodes are set up for cgroup v1 only)")
	}
	for _, m := range v1 {
		for _, d := range paths {
			dir := filepath.Join(m, d)
			if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
				return err
			}
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				if data, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f)); err == nil {
					if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
						return fmt.Errorf("%s: %v", filepath.Join(dir, f), err)
					}
				}
			}
		}
	}
	return nil
}

// cgroupProcsFiles: the cgroup's cgroup.procs in every v1 hierarchy (a process joins it by writing its pid).
func cgroupProcsFiles(path string) []string {
	v1, _ := cgroupMounts()
	var out []string
	for _, m := range v1 {
		out = append(out, filepath.Join(m, path, "cgroup.procs"))
	}
	return out
}

// joinCgroup: a command prefix that runs argv in the cgroup (every v1 hierarchy); with it, whatever the stack
// leaves behind can be found and ended.
const joinScript = `while [ "$1" != "--" ]; do echo $$ > "$1"; shift; done; shift; exec "$@"`

func joinCgroup(path string, argv ...string) []string {
	out := append([]string{"sh", "-c", joinScript, "join-cgroup"}, cgroupProcsFiles(path)...)
	return append(append(out, "--"), argv...)
}

// removeCgroup kills every process left in the cgroup (containers, shims) and removes it with all below it,
// in every hierarchy.
func removeCgroup(path string) error {
	v1, v2 := cgroupMounts()
	roots := []string{}
	for _, m := range append(v1, v2) {
		if m == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(m, path)); err == nil {
			roots = append(roots, filepath.Join(m, path))
		}
	}
	for try := 0; ; try++ {
		pids := map[int]bool{}
		for _, r := range roots {
			filepath.Walk(r, func(p string, info os.FileInfo, err error) error {
				if err == nil && !info.IsDir() && info.Name() == "cgroup.procs" {
					data, _ := os.ReadFile(p)
					for _, f := range strings.Fields(string(data)) {
						if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
							pids[pid] = true
						}
					}
				}
				return nil
			})
		}
		if len(pids) == 0 {
			break
		}
		if try == 100 {
			return fmt.Errorf("processes left in %s after 10 s of SIGKILL: %v", path, pids)
		}
		for pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var errs []string
	for _, r := range roots {
		var dirs []string
		filepath.Walk(r, func(p string, info os.FileInfo, err error) error {
			if err == nil && info.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		// Deepest first.
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for try := 0; try < 50; try++ { // a cgroup whose last task just exited can be busy for a moment
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Sprintf("%s: %v", d, err))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("removing cgroups: %s", strings.Join(errs, "; "))
	}
	return nil
}

// removeLeftovers removes what an earlier stack with real nodes left behind when it could not stop (killed
// with -9): its bridges, cgroups and kube-proxy's nftables tables. Called with the lock held, so none of it
// belongs to a running stack.
func removeLeftovers() {
	// Its processes first (in its cgroup: kubelets, containerd, shims, containers, kube-proxy, CoreDNS, the
	// registry), so that nothing recreates the rest.
	v1, v2 := cgroupMounts()
	seen := map[string]bool{}
	for _, m := range append(v1, v2) {
		if m == "" {
			continue
		}
		entries, _ := os.ReadDir(m)
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), realCgroupPrefix) && !seen[e.Name()] {
				seen[e.Name()] = true
				say("removing the cgroup /%s left by an earlier stack, and the processes in it", e.Name())
				if err := removeCgroup("/" + e.Name()); err != nil {
					say("%v", err)
				}
			}
		}
	}
	if links, err := net.Interfaces(); err == nil {
		for _, l := range links {
			if strings.HasPrefix(l.Name, realBridgePrefix) {
				say("removing the bridge %s left by an earlier stack", l.Name)
				if err := runQuiet("ip", "link", "del", l.Name); err != nil {
					say("%v", err)
				}
			}
		}
	}
	removeProxyTables(true)
	removeNetpolRules(true)
}

// dropImages removes what the real nodes pulled and the registry's storage (nil: none were started). Called
// after cleanup, when the stack's dir is kept for its logs.
func (rn *realNodes) dropImages() {
	if rn == nil {
		return
	}
	for _, n := range rn.nodes {
		os.RemoveAll(filepath.Join(n.dir, "containerd"))
	}
	os.RemoveAll(filepath.Join(rn.dir, "registry"))
	os.RemoveAll(filepath.Join(rn.dir, "private"))
}

// removeProxyTables deletes kube-proxy's nftables tables (nftables mode keeps all its rules in them).
func removeProxyTables(leftover bool) {
	for _, fam := range []string{"ip", "ip6"} {
		if exec.Command("nft", "list", "table", fam, "kube-proxy").Run() == nil {
			if leftover {
				say("removing the nftables table %s kube-proxy left by an earlier stack", fam)
			}
			if err := runQuiet("nft", "delete", "table", fam, "kube-proxy"); err != nil {
				say("%v", err)
			}
		}
	}
}

// ---- starting: after the API server is ready

func (rn *realNodes) start() error {
	s := rn.s
	bin := s.nodeBin
	say("starting the real nodes %s (%s s)", strings.Join(rn.names(), ", "), s.since())
	// RBAC: kubelets as system:node (the API server has no Node authorizer here), CoreDNS's reads.
	if err := s.kube(`apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: trainyard:real-nodes
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:node
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: Group
  name: system:nodes
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: trainyard:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: trainyard:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: trainyard:coredns
subjects:
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: trainyard:coredns
`, "apply", "--server-side", "-f", "-"); err != nil {
		return crdFailure(err, "the real nodes' RBAC objects were refused: "+s.crdsLog())
	}

	// ---- the registry, and the images the nodes need
	if err := writeFile(filepath.Join(rn.dir, "registry.yml"), registryConfig(filepath.Join(rn.dir, "registry"), rn.registry, "")); err != nil {
		return err
	}
	if err := s.startProc("registry", nil, joinCgroup(rn.cgroup+"/services", "docker-registry", "serve", filepath.Join(rn.dir, "registry.yml"))...); err != nil {
		return err
	}
	if err := s.waitFor("registry", registryReadyS, s.httpOK("http://"+rn.registry+"/v2/", nil)); err != nil {
		return err
	}
	if err := rn.startPrivateRegistry(); err != nil {
		return err
	}
	t := time.Now()
	if _, err := pushImage(imageSpec{Ref: rn.pauseRef, Files: []string{filepath.Join(bin, "pause") + "=/pause"},
		Entrypoint: []string{"/pause"}}); err != nil {
		return die("the pause image: %v", err)
	}
	extras := filepath.Join(rn.dir, "base-extras")
	for f, text := range map[string]string{
		"etc/passwd":        "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"etc/group":         "root:x:0:\nnogroup:x:65534:\n",
		"etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(extras, f)), 0o755); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(extras, f), text); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(extras, "usr", "bin"), 0o755); err != nil {
		return err
	}
	if err := os.Symlink("nc.openbsd", filepath.Join(extras, "usr", "bin", "nc")); err != nil {
		return err
	}
	base, err := pushImage(imageSpec{Ref: rn.baseRef, Dirs: []string{extras},
		DebianPackages: strings.Split(baseImagePkgs, ","), Cmd: []string{"/bin/bash"}})
	if err != nil {
		return die("the base image: %v", err)
	}
	// The training operator's init container for PyTorchJob workers (it waits until the master's name resolves,
	// with `sh`, `seq` and `nslookup`): dash as /bin/sh, coreutils, and an nslookup that asks the resolver the
	// pods use (getent).
	initExtras := filepath.Join(rn.dir, "init-extras")
	if err := os.MkdirAll(filepath.Join(initExtras, "usr", "bin"), 0o755); err != nil {
		return err
	}
	if err := os.Symlink("dash", filepath.Join(initExtras, "usr", "bin", "sh")); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(initExtras, "usr", "bin", "nslookup"),
		[]byte("#!/bin/sh\n# The name's addresses as the pod's resolver gives them; exit 2 when it has none.\nexec getent hosts \"$1\"\n"), 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(initExtras, "etc"), 0o755); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(initExtras, "etc", "nsswitch.conf"), "hosts: files dns\n"); err != nil {
		return err
	}
	if _, err := pushImage(imageSpec{Ref: rn.initRef, Dirs: []string{initExtras},
		DebianPackages: []string{"dash", "coreutils", "libc-bin"}, Cmd: []string{"/bin/sh"}}); err != nil {
		return die("the init-pytorch image: %v", err)
	}
	say("images pushed to %s: trainyard/pause:1, trainyard/base:1 (%d files, %.1f MiB), trainyard/init-pytorch:1 in %.1f s",
		rn.registry, base.Files, float64(base.LayerBytes)/(1<<20), time.Since(t).Seconds())

	// ---- CoreDNS on every gateway address
	if err := writeFile(filepath.Join(rn.dir, "coredns.kubeconfig"),
		kubeconfig(s.apiURL, filepath.Join(s.pki, "ca.crt"), "trainyard:coredns", rn.dnsTok)); err != nil {
		return err
	}
	var binds []string
	for _, n := range rn.nodes {
		binds = append(binds, n.gateway)
	}
	if err := writeFile(filepath.Join(rn.dir, "Corefile"), fmt.Sprintf(`.:53 {
    bind %s
    errors
    health 127.0.0.1:%d
    ready 127.0.0.1:%d
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig %s trainyard
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    forward . /etc/resolv.conf
    cache 5
}
`, strings.Join(binds, " "), rn.dnsHealth, rn.dnsReady, filepath.Join(rn.dir, "coredns.kubeconfig"))); err != nil {
		return err
	}
	if err := s.startProc("coredns", nil, joinCgroup(rn.cgroup+"/services", filepath.Join(bin, "coredns"), "-conf", filepath.Join(rn.dir, "Corefile"))...); err != nil {
		return err
	}

	// ---- containerd and the kubelet, per node
	for _, n := range rn.nodes {
		if err := rn.startContainerd(n); err != nil {
			return err
		}
	}
	for _, n := range rn.nodes {
		if err := rn.startKubelet(n); err != nil {
			return err
		}
	}

	// ---- kube-proxy, one for the machine (Services' cluster IPs for pods on every real node)
	if err := writeFile(filepath.Join(rn.dir, "kube-proxy.kubeconfig"),
		kubeconfig(s.apiURL, filepath.Join(s.pki, "ca.crt"), "system:kube-proxy", rn.proxyTok)); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(rn.dir, "kube-proxy.yaml"), fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: %s
mode: nftables
clusterCIDR: %s
hostnameOverride: %s
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`, filepath.Join(rn.dir, "kube-proxy.kubeconfig"), realClusterCIDR, rn.nodes[0].name, rn.proxyPort[0], rn.proxyPort[1])); err != nil {
		return err
	}
	if err := s.startProc("kube-proxy", nil, joinCgroup(rn.cgroup+"/services", filepath.Join(bin, "kube-proxy"), "--config="+filepath.Join(rn.dir, "kube-proxy.yaml"), "--v=1")...); err != nil {
		return err
	}
	return rn.startAPIForwarder()
}

// The real nodes' NetworkPolicy enforcement: kube-router's policy controller, which keeps its rules in the host's
// iptables filter table (chains with these prefixes, jumped to from INPUT, FORWARD and OUTPUT) and its ipsets.
var (
	netpolChainPrefixes = []string{"KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-"}
	netpolSetPrefixes   = []string{"KUBE-SRC-", "KUBE-DST-", "inet6:KUBE-SRC-", "inet6:KUBE-DST-"}
)

// startNetpol starts the NetworkPolicy enforcement: kube-router with its policy controller alone
// (--run-firewall; neither its router nor its service proxy), in the host's iptables (Debian's iptables-nft)
// and ipsets. One per machine, policing the pods of the first node only: its rules are the host's, and a
// second controller, for another node, would remove the first one's chains at each of its syncs (each keeps
// those of its own node's pods). Pods on the other nodes are not policed: tests of NetworkPolicy attack pods
// on the first node. As every kube-router does, it lets in traffic from the pod's own node (here the host: the
// kubelet's probes, the API server's pod proxy). It reads the cluster with the admin's kubeconfig.
func (rn *realNodes) startNetpol() error {
	s := rn.s
	for _, tool := range []string{"iptables", "iptables-save", "iptables-restore", "ipset"} {
		if _, err := exec.LookPath(tool); err != nil {
			return die("the real nodes' NetworkPolicy enforcement needs %s (Debian's iptables and ipset; scripts/install-deps test installs them)", tool)
		}
	}
	return s.startProc("kube-router", nil, joinCgroup(rn.cgroup+"/services", filepath.Join(s.netpolBin, "kube-router"),
		"--kubeconfig="+s.path("kubeconfig"), "--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
		"--enable-cni=false", "--hostname-override="+rn.nodes[0].name, "--health-port=0", "--metrics-port=0",
		"--service-cluster-ip-range=10.96.0.0/12", "--v=1")...)
}

// netpolSynced: kube-router has made its chains (at its first sync).
func netpolSynced() bool {
	return exec.Command("iptables", "-w", "-n", "-L", "KUBE-ROUTER-FORWARD").Run() == nil
}

// removeNetpolRules removes kube-router's rules, chains and ipsets (it leaves them when it stops). The filter
// table is written back without them; the rest of it is kept as it was.
func removeNetpolRules(leftover bool) {
	if _, err := exec.LookPath("iptables-save"); err != nil {
		return
	}
	ours := func(line string) bool {
		for _, p := range netpolChainPrefixes {
			if strings.HasPrefix(line, ":"+p) || strings.HasPrefix(line, "-A "+p) || strings.Contains(line, " -j "+p) {
				return true
			}
		}
		return false
	}
	if out, err := exec.Command("iptables-save", "-t", "filter").Output(); err == nil {
		var keep []string
		found := false
		for _, line := range strings.Split(string(out), "\n") {
			if ours(line) {
				found = true
				continue
			}
			keep = append(keep, line)
		}
		if found {
			if leftover {
				say("removing the iptables rules kube-router left by an earlier stack")
			}
			cmd := exec.Command("iptables-restore", "-w")
			cmd.Stdin = strings.NewReader(strings.Join(keep, "\n"))
			if out, err := cmd.CombinedOutput(); err != nil {
				say("iptables-restore: %v: %s", err, strings.TrimSpace(string(out)))
			}
		}
	}
	out, err := exec.Command("ipset", "list", "-n").Output()
	if err != nil {
		return
	}
	for _, name := range strings.Fields(string(out)) {
		for _, p := range netpolSetPrefixes {
			if strings.HasPrefix(name, p) {
				if err := runQuiet("ipset", "destroy", name); err != nil {
					say("%v", err)
				}
				break
			}
		}
	}
}

// apiPodPort: where pods reach the API server, on the first node's gateway address.
const apiPodPort = 6443

// startAPIForwarder lets pods reach the API server, as in-cluster clients do (the `kubernetes` Service,
// 10.96.0.1:443): the API server listens on loopback only, so a forwarder on the first node's gateway address
// (the host's side of its bridge, which every pod's traffic reaches through the host's routes) passes
// connections on to it, and the Service's EndpointSlice names that address (the API server reconciles no
// endpoints here). TLS is the API server's own, end to end; its certificate names 10.96.0.1.
func (rn *realNodes) startAPIForwarder() error {
	s := rn.s
	listen := net.JoinHostPort(rn.nodes[0].gateway, strconv.Itoa(apiPodPort))
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return die("the API server's address for pods, %s: %v", listen, err)
	}
	rn.apiFwd = l
	target := strings.TrimPrefix(s.apiURL, "https://")
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.DialTimeout("tcp", target, 10*time.Second)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); up.Close() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	if err := s.kube(fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels:
    kubernetes.io/service-name: kubernetes
    endpointslice.kubernetes.io/managed-by: trainyard-kube-stack
addressType: IPv4
endpoints:
- addresses: [%q]
  conditions: {ready: true}
ports:
- name: https
  port: %d
  protocol: TCP
`, rn.nodes[0].gateway, apiPodPort), "apply", "--server-side", "-f", "-"); err != nil {
		return crdFailure(err, "the kubernetes Service's endpoints were refused: "+s.crdsLog())
	}
	return nil
}

func (rn *realNodes) startContainerd(n *realNode) error {
	s := rn.s
	cfg := filepath.Join(n.dir, "containerd.toml")
	for _, host := range []string{rn.registry, rn.private} {
		if err := os.MkdirAll(filepath.Join(n.dir, "certs.d", host), 0o755); err != nil {
			return err
		}
		if err := writeFile(filepath.Join(n.dir, "certs.d", host, "hosts.toml"), fmt.Sprintf(`server = "http://%[1]s"

[host."http://%[1]s"]
  capabilities = ["pull", "resolve"]
`, host)); err != nil {
			return err
		}
	}
	if err := writeFile(filepath.Join(n.dir, "cni", "10-trainyard.conflist"), fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "trainyard-%s",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "%s",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "%s", "gateway": "%s"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "%s"
      }
    }
  ]
}
`, n.name, n.bridge, n.podCIDR, n.gateway, filepath.Join(n.dir, "ipam"))); err != nil {
		return err
	}
	// Version 2 config (containerd 1.6). State under the private /run; the socket in the node's dir.
	if err := writeFile(cfg, fmt.Sprintf(`version = 2
root = "%[1]s/containerd/root"
state = "/run/trainyard/containerd"
oom_score = 0
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "%[2]s"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "%[3]s"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  max_container_log_line_size = 16384
  # This machine refuses a negative oom_score_adj (no CAP_SYS_RESOURCE): the sandbox's -998 would make runc's
  # init fail ("failed to update /proc/self/oom_score_adj"); keep every container at containerd's own (0) or above.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "%[4]s"
    conf_dir = "%[1]s/cni"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "%[1]s/certs.d"
`, n.dir, n.containerdSock, rn.pauseRef, filepath.Join(s.nodeBin, "cni"))); err != nil {
		return err
	}
	// The node's mount namespace: see the top of this file. $0 is the node's dir; then the cgroup.procs files
	// to join; then containerd's command line after "--".
	setup := `set -e
dir=$0
mount -t tmpfs -o mode=0755 trainyard-node /run
mkdir -p /run/lock
mount -t tmpfs -o mode=0755 trainyard-node /var/lib
mkdir -p /var/lib/kubelet
mount --bind "$dir/varlog" /var/log
for kv in ` + sysctlPairs() + `; do
  name=${kv%=*}
  f="$dir/sysctl/$(echo "$name" | tr / .)"
  echo "${kv#*=}" > "$f"
  mount --bind "$f" "/proc/sys/$name"
done
while [ "$1" != "--" ]; do echo $$ > "$1"; shift; done
shift
exec "$@"`
	argv := []string{"unshare", "--mount", "--propagation", "private", "--", "sh", "-c", setup, n.dir}
	argv = append(argv, cgroupProcsFiles(n.cgroup+"/runtime")...)
	argv = append(argv, "--", "containerd", "--config", cfg)
	name := "containerd-" + n.name
	if err := s.startProc(name, nil, argv...); err != nil {
		return err
	}
	n.containerdPid = s.procs[len(s.procs)-1].cmd.Process.Pid
	return s.waitFor(name, containerdReadyS, func() bool {
		c, err := net.Dial("unix", n.containerdSock)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

func sysctlPairs() string {
	var out []string
	for _, kv := range kubeletSysctls {
		out = append(out, kv.name+"="+kv.value)
	}
	return strings.Join(out, " ")
}

func (rn *realNodes) startKubelet(n *realNode) error {
	s := rn.s
	kc := filepath.Join(n.dir, "kubelet.kubeconfig")
	if err := writeFile(kc, kubeconfig(s.apiURL, filepath.Join(s.pki, "ca.crt"), "system:node:"+n.name, n.token)); err != nil {
		return err
	}
	cfg := filepath.Join(n.dir, "kubelet.yaml")
	if err := writeFile(cfg, fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %[1]s
port: %[2]d
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %[3]d
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: %[4]s
authorization:
  mode: AlwaysAllow
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %[5]s
cgroupsPerQOS: true
containerRuntimeEndpoint: unix://%[6]s
clusterDomain: cluster.local
clusterDNS: [%[1]s]
resolvConf: /etc/resolv.conf
podLogsDir: %[7]s/pod-logs
volumePluginDir: %[7]s/volume-plugins
protectKernelDefaults: true
failSwapOn: false
serializeImagePulls: false
registerNode: true
registerWithTaints:
- key: %[8]s
  value: "true"
  effect: NoSchedule
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%%
  imagefs.available: 1%%
  nodefs.inodesFree: 1%%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
shutdownGracePeriod: 0s
nodeStatusReportFrequency: 10s
maxPods: 110
`, n.gateway, n.kubeletPort, n.healthz, filepath.Join(s.pki, "ca.crt"), n.cgroup, n.containerdSock, n.dir, realLabel)); err != nil {
		return err
	}
	name := "kubelet-" + n.name
	// No iptables on the kubelet's PATH: it would otherwise add its chains (KUBE-FIREWALL, KUBE-KUBELET-CANARY,
	// KUBE-IPTABLES-HINT) to the host's iptables, for kube-proxy's iptables mode; ours runs in nftables mode.
	if err := s.startProc(name, []string{"PATH=/usr/local/bin:/usr/bin:/bin"}, joinCgroup(n.cgroup+"/kubelet",
		"nsenter", "--target", strconv.Itoa(n.containerdPid), "--mount", "--", filepath.Join(s.nodeBin, "kubelet"), "--config="+cfg, "--kubeconfig="+kc, "--root-dir="+filepath.Join(n.dir, "kubelet"),
		"--cert-dir="+filepath.Join(n.dir, "kubelet", "pki"), "--hostname-override="+n.name, "--node-ip="+n.gateway,
		"--node-labels="+realLabel+"=true,trainyard.dev/pool=real", "--v=1")...); err != nil {
		return err
	}
	return nil
}

// ready waits for CoreDNS, kube-proxy and every node's Ready condition, then starts the NetworkPolicy
// enforcement and waits for its first sync.
func (rn *realNodes) ready() error {
	s := rn.s
	if err := s.waitFor("coredns", corednsReadyS, s.httpOK(fmt.Sprintf("http://127.0.0.1:%d/ready", rn.dnsReady), nil)); err != nil {
		return err
	}
	if err := s.waitFor("kube-proxy", controllersReadyS, s.httpOK(fmt.Sprintf("http://127.0.0.1:%d/healthz", rn.proxyPort[0]), nil)); err != nil {
		return err
	}
	for _, n := range rn.nodes {
		name := "kubelet-" + n.name
		if err := s.waitFor(name, realNodeReadyS, func() bool {
			out, err := exec.CommandContext(s.ctx, s.kubectl[0], append(s.kubectl[1:], "get", "node", n.name, "-o",
				`jsonpath={.status.conditions[?(@.type=="Ready")].status}`)...).Output()
			return err == nil && string(out) == "True"
		}); err != nil {
			return err
		}
	}
	// The NetworkPolicy enforcement once its node is registered (kube-router finds its node by name at start).
	if err := rn.startNetpol(); err != nil {
		return err
	}
	return s.waitFor("kube-router", controllersReadyS, netpolSynced)
}

func (rn *realNodes) envLines() string {
	return fmt.Sprintf("TRAINYARD_KUBE_REAL_NODES=%s\nTRAINYARD_KUBE_REGISTRY=%s\nTRAINYARD_KUBE_BASE_IMAGE=%s\nTRAINYARD_KUBE_PAUSE_IMAGE=%s\nTRAINYARD_KUBE_PRIVATE_REGISTRY=%s\nTRAINYARD_KUBE_PRIVATE_LOGIN=%s\n",
		strings.Join(rn.names(), ","), rn.registry, rn.baseRef, rn.pauseRef, rn.private, rn.privateLogin())
}

// registryConfig: a docker-registry's configuration, storing in dir and serving plain http on addr; with a
// login from the htpasswd file when one is given.
func registryConfig(dir, addr, htpasswd string) string {
	conf := fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, dir, addr)
	if htpasswd != "" {
		conf += fmt.Sprintf("auth:\n  htpasswd:\n    realm: trainyard-kube-stack\n    path: %s\n", htpasswd)
	}
	return conf
}

// privateLogin is the private registry's login as USER:PASSWORD.
func (rn *realNodes) privateLogin() string {
	return "trainyard:" + rn.privPass
}

// startPrivateRegistry starts the registry that answers only with a login: docker-registry's htpasswd, whose
// bcrypt hash glibc's crypt makes (through python3; Go's standard library has no bcrypt).
func (rn *realNodes) startPrivateRegistry() error {
	s := rn.s
	out, err := exec.Command("python3", "-W", "ignore", "-c",
		"import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))", rn.privPass).Output()
	hash := strings.Replace(strings.TrimSpace(string(out)), "$2b$", "$2a$", 1)
	if err != nil || !strings.HasPrefix(hash, "$2a$") {
		return die("a bcrypt hash for the private registry's login (python3's crypt): %v %q", err, hash)
	}
	htpasswd := filepath.Join(rn.dir, "private.htpasswd")
	if err := writeFile(htpasswd, "trainyard:"+hash+"\n"); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(rn.dir, "private.yml"), registryConfig(filepath.Join(rn.dir, "private"), rn.private, htpasswd)); err != nil {
		return err
	}
	if err := s.startProc("private-registry", nil, joinCgroup(rn.cgroup+"/services", "docker-registry", "serve", filepath.Join(rn.dir, "private.yml"))...); err != nil {
		return err
	}
	// Without a login it answers 401; that it answers at all is what is waited for.
	return s.waitFor("private-registry", registryReadyS, func() bool {
		resp, err := http.Get("http://" + rn.private + "/v2/")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusUnauthorized
	})
}

func (rn *realNodes) setEnv() {
	os.Setenv("TRAINYARD_KUBE_REAL_NODES", strings.Join(rn.names(), ","))
	os.Setenv("TRAINYARD_KUBE_REGISTRY", rn.registry)
	os.Setenv("TRAINYARD_KUBE_BASE_IMAGE", rn.baseRef)
	os.Setenv("TRAINYARD_KUBE_PAUSE_IMAGE", rn.pauseRef)
	os.Setenv("TRAINYARD_KUBE_PRIVATE_REGISTRY", rn.private)
	os.Setenv("TRAINYARD_KUBE_PRIVATE_LOGIN", rn.privateLogin())
}

// ---- stopping: after every process of the stack got its TERM (and KILL)

func (rn *realNodes) cleanup() {
	if rn == nil || rn.cleaned {
		return
	}
	rn.cleaned = true
	if rn.router != nil {
		rn.router.Close()
	}
	if rn.apiFwd != nil {
		rn.apiFwd.Close()
	}
	if rn.lock == nil {
		return // stopped while waiting for the lock: the machine's bridges and tables are another stack's
	}
	if err := removeCgroup(rn.cgroup); err != nil {
		say("%v", err)
	}
	for _, n := range rn.nodes {
		if _, err := net.InterfaceByName(n.bridge); err == nil {
			if err := runQuiet("ip", "link", "del", n.bridge); err != nil {
				say("%v", err)
			}
		}
	}
	removeProxyTables(false)
	removeNetpolRules(false)
	if rn.lock != nil {
		rn.lock.Truncate(0)
		syscall.Flock(int(rn.lock.Fd()), syscall.LOCK_UN)
		rn.lock.Close()
	}
}

// ---- the API server's egress to nodes and pods

// startEgressRouter: the API server's "cluster" egress (HTTP CONNECT on a unix socket) goes here when there are
// real nodes: tunnels to the real nodes' addresses (kubelets, pods: 10.244.0.0/16) and to loopback are dialled
// directly; the rest (kwok's simulated pods) is passed on to the pod network stand-in's socket, as without
// real nodes.
func (rn *realNodes) startEgressRouter() error {
	sock := rn.s.path("egress-router.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	rn.router = l
	_, real, _ := net.ParseCIDR(realClusterCIDR)
	sim := rn.s.path("egress.sock")
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect {
			http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
			return
		}
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			http.Error(w, "bad CONNECT target", http.StatusBadRequest)
			return
		}
		ip := net.ParseIP(host)
		var upstream net.Conn
		var upReader *bufio.Reader
		if ip != nil && (real.Contains(ip) || ip.IsLoopback()) {
			upstream, err = net.DialTimeout("tcp", r.Host, 10*time.Second)
		} else {
			// On to the stand-in, with the same CONNECT.
			upstream, err = net.DialTimeout("unix", sim, 10*time.Second)
			if err == nil {
				fmt.Fprintf(upstream, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", r.Host, r.Host)
				upReader = bufio.NewReader(upstream)
				var resp *http.Response
				resp, err = http.ReadResponse(upReader, &http.Request{Method: http.MethodConnect})
				if err == nil && resp.StatusCode != http.StatusOK {
					msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
					upstream.Close()
					http.Error(w, strings.TrimSpace(string(msg)), resp.StatusCode)
					return
				}
			}
		}
		if err != nil {
			if upstream != nil {
				upstream.Close()
			}
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		hj, ok := w.(http.Hijacker)
		if !ok {
			upstream.Close()
			http.Error(w, "no hijacking", http.StatusInternalServerError)
			return
		}
		conn, rw, err := hj.Hijack()
		if err != nil {
			upstream.Close()
			return
		}
		if _, err := conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
			conn.Close()
			upstream.Close()
			return
		}
		var from io.Reader = upstream
		if upReader != nil {
			from = upReader // what the stand-in sent after its answer may be buffered there
		}
		go func() {
			io.Copy(upstream, rw.Reader)
			if c, ok := upstream.(interface{ CloseWrite() error }); ok {
				c.CloseWrite()
			} else {
				upstream.Close()
			}
		}()
		io.Copy(conn, from)
		conn.Close()
		upstream.Close()
	}))
	return nil
}

// ---- certificates

// writeClientCert writes <name>.crt and <name>.key into dir: a client certificate (CN cn, O org) signed by the
// stack's CA (ca.crt, ca.key in dir).
func writeClientCert(dir, name, cn, org string) error {
	caPEM, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, "ca.key"))
	if err != nil {
		return err
	}
	cb, _ := pem.Decode(caPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return fmt.Errorf("the CA's files in %s are not PEM", dir)
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return err
	}
	caKey, err := x509.ParseECPrivateKey(kb.Bytes)
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn, Organization: []string{org}},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(certValidity),
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}
