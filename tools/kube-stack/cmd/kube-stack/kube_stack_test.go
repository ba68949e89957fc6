package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// The key's bytes are those the shell version hashed: go version, the flags, then "== name", go.mod, go.sum for
// each direct subdirectory with a go.mod, in name order. Subdirectories without one (stages/, cmd/) are not in it.
func TestKeySource(t *testing.T) {
	ks := t.TempDir()
	write(t, ks+"/kwok/go.mod", "module k\n")
	write(t, ks+"/kwok/go.sum", "k sum\n")
	write(t, ks+"/etcd/go.mod", "module e\n")
	write(t, ks+"/etcd/go.sum", "")
	write(t, ks+"/stages/pod.yaml", "x\n")
	write(t, ks+"/cmd/kube-stack/go.mod", "module c\n")
	write(t, ks+"/README.md", "r\n")
	got, err := keySource(ks, []byte("go version go1.26.8 linux/amd64\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := "go version go1.26.8 linux/amd64\n-trimpath -ldflags=-s -w\n== etcd\nmodule e\n== kwok\nmodule k\nk sum\n"
	if string(got) != want {
		t.Errorf("keySource:\n%q\nwant\n%q", got, want)
	}
}

// The stand-in's stamp: sha256 of go.mod then the *.go files in name order, 16 hex digits (as `cat go.mod ./*.go |
// sha256sum | cut -c1-16`).
func TestSrcStamp(t *testing.T) {
	dir := t.TempDir()
	write(t, dir+"/go.mod", "a")
	write(t, dir+"/main.go", "b")
	write(t, dir+"/podnet.go", "c")
	write(t, dir+"/notes.txt", "d")
	got, err := srcStamp(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := "ba7816bf8f01cfea"; got != want { // sha256("abc")
		t.Errorf("srcStamp = %s, want %s", got, want)
	}
}

func TestKustomizationResources(t *testing.T) {
	for _, c := range []struct{ text, want string }{
		{"resources:\n- a.yaml\n  - b.yaml # why\n# comment\n\n- c.yaml\nimages:\n- d.yaml\n", "a.yaml b.yaml c.yaml"},
		{"apiVersion: x\nresources:\n  - a.yaml\nkind: K\n", "a.yaml"},
		{"resources: []\n", ""},
		{"namespace: n\n- a.yaml\n", ""},
	} {
		if got := strings.Join(kustomizationResources(c.text), " "); got != c.want {
			t.Errorf("kustomizationResources(%q) = %q, want %q", c.text, got, c.want)
		}
	}
}

func TestTail(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.log")
	long := strings.Repeat("x", 70<<10)
	for _, c := range []struct {
		text string
		n    int
		want string
	}{
		{"1\n2\n3\n", 2, "2\n3\n"},
		{"1\n2\n3", 2, "2\n3\n"},
		{"1\n2\n3\n", 5, "1\n2\n3\n"},
		{"", 3, ""},
		{"1\n", 0, ""},
		{"a\n" + long + "\n" + long + "\nz\n", 2, long + "\nz\n"},
	} {
		write(t, path, c.text)
		if got := string(tail(path, c.n)); got != c.want {
			t.Errorf("tail(%.20q, %d) = %.20q, want %.20q", c.text, c.n, got, c.want)
		}
	}
}

func TestLdflags(t *testing.T) {
	if got := ldflagsFor("kuberay-operator"); got != "-s -w" {
		t.Errorf("kuberay-operator: %q", got)
	}
	if got := ldflagsFor("kubelet"); !strings.Contains(got, "-X k8s.io/component-base/version.gitVersion=v1.37.2") {
		t.Errorf("kubelet: %q", got)
	}
	got := ldflagsFor("kube-apiserver")
	for _, want := range []string{"-s -w ", "-X k8s.io/component-base/version.gitVersion=v1.37.2",
		"-X k8s.io/client-go/pkg/version.gitMinor=37", "-X k8s.io/client-go/pkg/version.gitTreeState=clean"} {
		if !strings.Contains(got, want) {
			t.Errorf("kube-apiserver: %q lacks %q", got, want)
		}
	}
}

// The stack's ports are below the kernel's ephemeral range, where no outgoing connection takes them first.
func TestFreePortsAreBelowTheEphemeralRange(t *testing.T) {
	low, high := portsBelowEphemeral()
	ports, err := freePorts(20)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d twice in %v", p, ports)
		}
		seen[p] = true
		if high > low && (p < low || p >= high) {
			t.Fatalf("port %d outside [%d, %d): %v", p, low, high, ports)
		}
	}
}
