package main

// Building the stack's components into the cache dir keyed by the pinned versions.

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

const k8sVersion = "v1.37.2"

// keyBuildFlags is the build flags' line in the cache key. It is hashed as text, exactly as the shell version
// of with-kube hashed it, so that an existing cache dir keeps its name; change it only with the flags.
const keyBuildFlags = "-trimpath -ldflags=-s -w"

// component: a binary, the wrapper module (tools/kube-stack/<dir>) that pins its version, and its main package;
// static: built with CGO_ENABLED=0 (it runs in an image with nothing else in it).
type component struct {
	name, dir, pkg string
	static         bool
}

var components = []component{
	{"etcd", "etcd", "go.etcd.io/etcd/server/v3", false},
	{"kube-apiserver", "kubernetes", "k8s.io/kubernetes/cmd/kube-apiserver", false},
	{"kube-controller-manager", "kubernetes", "k8s.io/kubernetes/cmd/kube-controller-manager", false},
	{"kube-scheduler", "kubernetes", "k8s.io/kubernetes/cmd/kube-scheduler", false},
	{"kubectl", "kubernetes", "k8s.io/kubernetes/cmd/kubectl", false},
	{"kwok", "kwok", "sigs.k8s.io/kwok/cmd/kwok", false},
	{"training-operator", "training-operator", "github.com/kubeflow/training-operator/cmd/training-operator.v1", false},
	{"kuberay-operator", "kuberay", "github.com/ray-project/kuberay/ray-operator", false},
	{"ray-dashboard-sim", "ray-dashboard-sim", "trainyard.dev/kube-stack/ray-dashboard-sim", false},
}

var kueueComponent = component{"kueue", "kueue", "sigs.k8s.io/kueue/cmd/kueue", false}

// nodeComponents: what the real nodes (--real-nodes) need, in wrapper modules under tools/kube-stack/nodes/
// (not direct subdirectories of tools/kube-stack, so the control plane's cache key does not see them); they are
// built into their own cache dir (subKey "nodes"). The CNI plugins go to bin/cni/.
var nodeComponents = []component{
	{"pause", "nodes/pause", "trainyard.dev/kube-stack/nodes/pause", true},
	{"cni/loopback", "nodes/cni", "github.com/containernetworking/plugins/plugins/main/loopback", false},
	{"cni/bridge", "nodes/cni", "github.com/containernetworking/plugins/plugins/main/bridge", false},
	{"cni/host-local", "nodes/cni", "github.com/containernetworking/plugins/plugins/ipam/host-local", false},
	{"cni/portmap", "nodes/cni", "github.com/containernetworking/plugins/plugins/meta/portmap", false},
	{"coredns", "nodes/coredns", "github.com/coredns/coredns", false},
	{"kube-proxy", "nodes/kubernetes", "k8s.io/kubernetes/cmd/kube-proxy", false},
	{"kubelet", "nodes/kubernetes", "k8s.io/kubernetes/cmd/kubelet", false},
}

// netpolComponents: the real nodes' NetworkPolicy enforcement, kube-router's policy controller alone, in a
// wrapper module under tools/kube-stack/netpol/ with a cache dir of its own (subKey "netpol"), so that the nodes' and
// the control plane's keys do not move with it.
var netpolComponents = []component{
	{"kube-router", "netpol/kube-router", "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router", false},
}

// cacheKey names the cache dir: k8s-<version>-<12 hex digits of a SHA-256>.
func cacheKey(ks string) (string, error) {
	out, err := exec.Command("go", "version").Output()
	if err != nil {
		return "", fmt.Errorf("go version: %v", err)
	}
	src, err := keySource(ks, out)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(src)
	return "k8s-" + k8sVersion + "-" + hex.EncodeToString(sum[:])[:12], nil
}

// subKey names the cache dir of the wrapper modules in tools/kube-stack/<sub>/ (the real nodes' "nodes", their
// NetworkPolicy enforcement's "netpol"): <sub>-<version>-<12 hex digits>, the same hash as cacheKey's over those
// modules.
func subKey(ks, sub string) (string, error) {
	out, err := exec.Command("go", "version").Output()
	if err != nil {
		return "", fmt.Errorf("go version: %v", err)
	}
	src, err := keySource(filepath.Join(ks, sub), out)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(src)
	return sub + "-" + k8sVersion + "-" + hex.EncodeToString(sum[:])[:12], nil
}

// keySource is what the key hashes: `go version`'s output, the build flags, then for every wrapper module (a
// direct subdirectory of tools/kube-stack with a go.mod, in name order) "== <name>", its go.mod and its go.sum.
// Any pinned version that changes gives a new dir, so an old cache is never half-reused. The bytes are those the
// shell version of with-kube hashed; this command's own module (cmd/kube-stack) is not a direct subdirectory,
// so it is not part of the key.
func keySource(ks string, goVersion []byte) ([]byte, error) {
	var b bytes.Buffer
	b.Write(goVersion)
	b.WriteString(keyBuildFlags + "\n")
	entries, err := os.ReadDir(ks) // sorted by name
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		dir := filepath.Join(ks, e.Name())
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			continue
		}
		if st, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil || !st.Mode().IsRegular() {
			continue
		}
		b.WriteString("== " + e.Name() + "\n")
		for _, f := range []string{"go.mod", "go.sum"} {
			data, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return nil, err
			}
			b.Write(data)
		}
	}
	return b.Bytes(), nil
}

// srcStamp: our own components (trainyard.dev/...) have no pinned version; a hash of their go.mod and *.go
// files, kept beside the binary (bin/.<name>.src), says whether the binary is theirs.
func srcStamp(moduleDir string) (string, error) {
	files, err := filepath.Glob(filepath.Join(moduleDir, "*.go"))
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	h := sha256.New()
	for _, f := range append([]string{filepath.Join(moduleDir, "go.mod")}, files...) {
		if strings.HasPrefix(filepath.Base(f), ".") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return "", err
		}
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// ldflagsFor: the Kubernetes binaries get their version stamped, as a release build would.
func ldflagsFor(name string) string {
	if !strings.HasPrefix(name, "kube-") && name != "kubectl" && name != "kubelet" {
		return "-s -w"
	}
	minor := strings.SplitN(strings.TrimPrefix(k8sVersion, "v1."), ".", 2)[0]
	out := "-s -w"
	for _, p := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		out += fmt.Sprintf(" -X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean",
			p, k8sVersion, p, p, minor, p)
	}
	return out
}

type builder struct {
	ks, cache, bin string
	// The Go build cache: a private one under the cache dir, emptied after each wrapper module's components
	// (they share little across modules), so a cold build needs about 5 GB at its peak rather than 8 GB more
	// for good; TRAINYARD_KUBE_GOCACHE names a cache to use and keep instead.
	gocache     string
	keepGocache bool
	lastDir     string
}

func newBuilder(ks, key string) *builder {
	cache := filepath.Join(cacheRoot(), key)
	b := &builder{ks: ks, cache: cache, bin: filepath.Join(cache, "bin"), gocache: filepath.Join(cache, ".gocache")}
	if g := os.Getenv("TRAINYARD_KUBE_GOCACHE"); g != "" {
		b.gocache, b.keepGocache = g, true
	}
	return b
}

func (b *builder) dropGocache() {
	if !b.keepGocache {
		os.RemoveAll(b.gocache)
	}
}

// buildAll builds what is missing and copies the CRDs.
func (b *builder) buildAll(withKueue bool) error {
	if err := os.MkdirAll(filepath.Join(b.cache, "crds"), 0o755); err != nil {
		return err
	}
	all := components
	if withKueue {
		all = append(append([]component{}, components...), kueueComponent)
	}
	return b.build(all, b.copyCRDs)
}

// buildSub builds cs, the components of the wrapper modules under tools/kube-stack/<sub>/, into their own cache
// dir (see subKey).
func buildSub(ks, sub string, cs []component) (*builder, error) {
	key, err := subKey(ks, sub)
	if err != nil {
		return nil, err
	}
	b := newBuilder(ks, key)
	return b, b.build(cs, nil)
}

// build builds what is missing of cs, then runs then (if any), one stack at a time per cache dir (two stacks
// started together wait for one build).
func (b *builder) build(cs []component, then func() error) error {
	if err := os.MkdirAll(b.bin, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(b.cache, ".lock"), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("locking %s: %v", lock.Name(), err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	for _, c := range cs {
		if err := b.buildOne(c); err != nil {
			return err
		}
	}
	b.dropGocache()
	if then != nil {
		return then()
	}
	return nil
}

func (b *builder) buildOne(c component) error {
	stamp := ""
	if strings.HasPrefix(c.pkg, "trainyard.dev/") {
		var err error
		if stamp, err = srcStamp(filepath.Join(b.ks, c.dir)); err != nil {
			return err
		}
	}
	out := filepath.Join(b.bin, c.name)
	if syscall.Access(out, 1 /* X_OK */) == nil && readTrimmed(filepath.Join(filepath.Dir(out), "."+filepath.Base(c.name)+".src")) == stamp {
		return nil
	}
	if b.lastDir != "" && b.lastDir != c.dir {
		b.dropGocache()
	}
	b.lastDir = c.dir
	say("building %s (%s in tools/kube-stack/%s)", c.name, c.pkg, c.dir)
	start := time.Now()
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	stampFile := filepath.Join(filepath.Dir(out), "."+filepath.Base(c.name)+".src")
	tmp := filepath.Join(filepath.Dir(out), "."+filepath.Base(c.name)+".tmp")
	cmd := exec.Command("nice", "-n", "10", "go", "build", "-ldflags="+ldflagsFor(c.name), "-o", tmp, c.pkg)
	cmd.Dir = filepath.Join(b.ks, c.dir)
	// -mod=readonly: the wrapper's go.mod and go.sum are complete (checked in); modules are downloaded as needed.
	cmd.Env = append(os.Environ(), "GOCACHE="+b.gocache, "GOFLAGS=-trimpath -mod=readonly -buildvcs=false",
		"GOMAXPROCS="+env("GOMAXPROCS", "2"))
	if c.static {
		cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building %s: %v", c.name, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	if err := os.WriteFile(stampFile, []byte(stamp+"\n"), 0o644); err != nil {
		return err
	}
	took := time.Since(start).Seconds()
	if f, err := os.OpenFile(filepath.Join(b.cache, "build-times"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		fmt.Fprintf(f, "%s %.1f\n", c.name, took)
		f.Close()
	}
	say("built %s in %.1f s", c.name, took)
	return nil
}

// moddir: a module's directory in the module cache, as the wrapper module resolves it (downloaded when missing).
func (b *builder) moddir(dir, module string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", module)
	cmd.Dir = filepath.Join(b.ks, dir)
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s (in tools/kube-stack/%s): %v", module, dir, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// copyCRDs copies the operators' CRDs from their module sources into crds/ (Kueue's into crds/kueue/).
func (b *builder) copyCRDs() error {
	crds := filepath.Join(b.cache, "crds")
	if _, err := os.Stat(filepath.Join(crds, ".done")); err == nil {
		return nil
	}
	to, err := b.moddir("training-operator", "github.com/kubeflow/training-operator")
	if err != nil {
		return err
	}
	files := []string{filepath.Join(to, "manifests/base/crds/kubeflow.org_pytorchjobs.yaml")}
	kr, err := b.moddir("kuberay", "github.com/ray-project/kuberay/ray-operator")
	if err != nil {
		return err
	}
	for _, n := range []string{"rayclusters", "rayjobs", "rayservices"} {
		files = append(files, filepath.Join(kr, "config/crd/bases/ray.io_"+n+".yaml"))
	}
	for _, f := range files {
		if err := copyFile(f, filepath.Join(crds, filepath.Base(f))); err != nil {
			return err
		}
	}
	if st, err := os.Stat(filepath.Join(b.ks, "kueue")); err == nil && st.IsDir() {
		kq, err := b.moddir("kueue", "sigs.k8s.io/kueue")
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Join(crds, "kueue"), 0o755); err != nil {
			return err
		}
		kfiles, _ := filepath.Glob(filepath.Join(kq, "config/components/crd/bases/*.yaml"))
		if len(kfiles) == 0 {
			return fmt.Errorf("no CRDs in %s/config/components/crd/bases", kq)
		}
		for _, f := range kfiles {
			if err := copyFile(f, filepath.Join(crds, "kueue", filepath.Base(f))); err != nil {
				return err
			}
		}
	}
	return os.WriteFile(filepath.Join(crds, ".done"), nil, 0o644)
}

// copyFile copies a file, writable by its owner (module cache files are read-only).
func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	os.Remove(to)
	return os.WriteFile(to, data, 0o644)
}

// readTrimmed: a file's text without its trailing newlines ("" when it cannot be read), as $(cat f) gives it.
func readTrimmed(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimRight(string(data), "\n")
}
