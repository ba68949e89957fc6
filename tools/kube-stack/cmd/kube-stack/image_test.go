package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
)

func TestSplitRef(t *testing.T) {
	for _, c := range []struct{ ref, host, name, tag string }{
		{"127.0.0.1:5000/trainyard/base:1", "127.0.0.1:5000", "trainyard/base", "1"},
		{"127.0.0.1:5000/pause", "127.0.0.1:5000", "pause", "latest"},
		{"localhost:5000/a/b/c:v1.2", "localhost:5000", "a/b/c", "v1.2"},
	} {
		host, name, tag, err := splitRef(c.ref)
		if err != nil || host != c.host || name != c.name || tag != c.tag {
			t.Errorf("splitRef(%q) = %q %q %q %v", c.ref, host, name, tag, err)
		}
	}
	if _, _, _, err := splitRef("pause"); err == nil {
		t.Error("splitRef(pause): no error")
	}
}

func TestCommandWords(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []string
	}{
		{"/pause", []string{"/pause"}},
		{"bash -c  true", []string{"bash", "-c", "true"}},
		{`["/bin/sh", "-c", "echo a b"]`, []string{"/bin/sh", "-c", "echo a b"}},
	} {
		got, err := commandWords(c.in)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("commandWords(%q) = %q, %v", c.in, got, err)
		}
	}
}

// layerEntries: a gzip'd tar's entries as "name type linkname mode size".
func layerEntries(t *testing.T, data []byte) []string {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	var out []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(layerTime) {
			t.Errorf("%s: owner %d:%d, time %v", h.Name, h.Uid, h.Gid, h.ModTime)
		}
		e := fmt.Sprintf("%s %c", h.Name, h.Typeflag)
		if h.Linkname != "" {
			e += " " + h.Linkname
		}
		e += fmt.Sprintf(" %o", h.Mode)
		if h.Size > 0 {
			e += fmt.Sprintf(" %d", h.Size)
		}
		out = append(out, e)
	}
}

// A host path under a symbolic link (as Debian's /bin -> usr/bin) goes in as the link and the file where the
// link points; --from-dir's contents go at the root; --file at its destination; the same files give the same
// digests.
func TestWriteLayer(t *testing.T) {
	root := t.TempDir()
	write(t, root+"/usr/bin/tool", "#!/bin/sh\n")
	os.Chmod(root+"/usr/bin/tool", 0o755)
	if err := os.Symlink("usr/bin", root+"/bin"); err != nil {
		t.Fatal(err)
	}
	extras := t.TempDir()
	write(t, extras+"/etc/passwd", "root:x:0:0::/:/bin/sh\n")
	write(t, root+"/pause", "binary")
	spec := imageSpec{Dirs: []string{extras}, Files: []string{root + "/pause=/pause"},
		Paths: []string{root + "/bin/tool"}}
	var a, b bytes.Buffer
	la, err := writeLayer(&a, spec)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := writeLayer(&b, spec)
	if err != nil {
		t.Fatal(err)
	}
	if la.digest != lb.digest || la.diffID != lb.diffID || !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Errorf("two layers of the same files differ: %+v %+v", la, lb)
	}
	sum := sha256.Sum256(a.Bytes())
	if la.digest != "sha256:"+hex.EncodeToString(sum[:]) || la.size != int64(a.Len()) {
		t.Errorf("digest %s size %d, want the gzip'd bytes' sha256 and length %d", la.digest, la.size, a.Len())
	}
	got := strings.Join(layerEntries(t, a.Bytes()), "\n")
	rel := strings.TrimPrefix(root, "/")
	for _, want := range []string{
		"etc/ 5 755", "etc/passwd 0 644 22", "pause 0 644 6",
		rel + "/bin 2 usr/bin 777", rel + "/usr/bin/tool 0 755 10",
	} {
		if !strings.Contains("\n"+got+"\n", "\n"+want+"\n") {
			t.Errorf("layer lacks %q; it has:\n%s", want, got)
		}
	}
	if strings.Contains(got, rel+"/bin/tool") {
		t.Errorf("the file went under the link's name, not where it points:\n%s", got)
	}
}

// A push: the blobs (a monolithic upload each, after a HEAD), then the manifest, whose config and layer name
// them; a blob the registry has already is not sent again.
func TestPushImage(t *testing.T) {
	var mu sync.Mutex
	blobs := map[string][]byte{}
	manifests := map[string][]byte{}
	var puts []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		p := r.URL.Path
		switch {
		case r.Method == http.MethodHead && strings.Contains(p, "/blobs/sha256:"):
			if _, ok := blobs[p[strings.LastIndex(p, "/")+1:]]; ok {
				w.WriteHeader(http.StatusOK)
			} else {
				w.WriteHeader(http.StatusNotFound)
			}
		case r.Method == http.MethodPost && strings.HasSuffix(p, "/blobs/uploads/"):
			w.Header().Set("Location", p+"some-uuid?_state=x")
			w.WriteHeader(http.StatusAccepted)
		case r.Method == http.MethodPut && strings.Contains(p, "/blobs/uploads/"):
			data, _ := io.ReadAll(r.Body)
			d := r.URL.Query().Get("digest")
			if r.URL.Query().Get("_state") != "x" || digestOf(data) != d {
				http.Error(w, "bad upload", http.StatusBadRequest)
				return
			}
			blobs[d] = data
			puts = append(puts, d)
			w.WriteHeader(http.StatusCreated)
		case r.Method == http.MethodPut && strings.Contains(p, "/manifests/"):
			data, _ := io.ReadAll(r.Body)
			manifests[p] = data
			w.WriteHeader(http.StatusCreated)
		default:
			http.Error(w, r.Method+" "+p, http.StatusNotFound)
		}
	}))
	defer srv.Close()
	dir := t.TempDir()
	write(t, dir+"/hello", "hi\n")
	ref := strings.TrimPrefix(srv.URL, "http://") + "/trainyard/test:7"
	img, err := pushImage(imageSpec{Ref: ref, Dirs: []string{dir}, Entrypoint: []string{"/hello"}, Env: []string{"A=1"}})
	if err != nil {
		t.Fatal(err)
	}
	m := manifests["/v2/trainyard/test/manifests/7"]
	if digestOf(m) != img.Digest {
		t.Fatalf("manifest %s, pushed %s", digestOf(m), img.Digest)
	}
	var man struct {
		MediaType string
		Config    struct{ Digest string }
		Layers    []struct{ Digest, MediaType string }
	}
	if err := json.Unmarshal(m, &man); err != nil {
		t.Fatal(err)
	}
	if man.MediaType != "application/vnd.oci.image.manifest.v1+json" || len(man.Layers) != 1 ||
		blobs[man.Config.Digest] == nil || blobs[man.Layers[0].Digest] == nil {
		t.Fatalf("manifest %s; blobs %d", m, len(blobs))
	}
	var cfg struct {
		Config struct {
			Entrypoint, Env []string
		}
		RootFS struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
	}
	if err := json.Unmarshal(blobs[man.Config.Digest], &cfg); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg.Config.Entrypoint, []string{"/hello"}) || len(cfg.RootFS.DiffIDs) != 1 ||
		cfg.Config.Env[len(cfg.Config.Env)-1] != "A=1" {
		t.Errorf("config %s", blobs[man.Config.Digest])
	}
	if len(puts) != 2 {
		t.Errorf("uploads %v, want the layer and the config", puts)
	}
	if _, err := pushImage(imageSpec{Ref: ref, Dirs: []string{dir}, Entrypoint: []string{"/hello"}, Env: []string{"A=1"}}); err != nil {
		t.Fatal(err)
	}
	if len(puts) != 2 {
		t.Errorf("the same image pushed again uploaded %v", puts[2:])
	}
}

// The nodes' key covers tools/kube-stack/nodes/<name>/ only; the control plane's key does not see them.
func TestNodesKeySource(t *testing.T) {
	ks := t.TempDir()
	write(t, ks+"/kwok/go.mod", "module k\n")
	write(t, ks+"/kwok/go.sum", "")
	write(t, ks+"/nodes/cni/go.mod", "module c\n")
	write(t, ks+"/nodes/cni/go.sum", "c sum\n")
	write(t, ks+"/nodes/pause/go.mod", "module p\n")
	write(t, ks+"/nodes/pause/go.sum", "")
	write(t, ks+"/nodes/pause/main.go", "package main\n")
	write(t, ks+"/netpol/kube-router/go.mod", "module r\n")
	write(t, ks+"/netpol/kube-router/go.sum", "r sum\n")
	gv := []byte("go version go1.26.8 linux/amd64\n")
	cp, err := keySource(ks, gv)
	if err != nil {
		t.Fatal(err)
	}
	if want := "go version go1.26.8 linux/amd64\n-trimpath -ldflags=-s -w\n== kwok\nmodule k\n"; string(cp) != want {
		t.Errorf("control plane's key source %q, want %q", cp, want)
	}
	nodes, err := keySource(filepath.Join(ks, "nodes"), gv)
	if err != nil {
		t.Fatal(err)
	}
	if want := "go version go1.26.8 linux/amd64\n-trimpath -ldflags=-s -w\n== cni\nmodule c\nc sum\n== pause\nmodule p\n"; string(nodes) != want {
		t.Errorf("nodes' key source %q, want %q", nodes, want)
	}
	netpol, err := keySource(filepath.Join(ks, "netpol"), gv)
	if err != nil {
		t.Fatal(err)
	}
	if want := "go version go1.26.8 linux/amd64\n-trimpath -ldflags=-s -w\n== kube-router\nmodule r\nr sum\n"; string(netpol) != want {
		t.Errorf("the NetworkPolicy enforcement's key source %q, want %q", netpol, want)
	}
}
