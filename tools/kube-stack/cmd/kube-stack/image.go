package main

// Container images built here, from files of this machine, with nothing pulled from outside: one gzip'd tar
// layer, an OCI image config and manifest, pushed to a registry over its v2 HTTP API (plain http, no auth; the
// stack's local registry). The layer's entries have fixed times and owners (root), so the same files give the
// same digests, and a registry or containerd that has a blob already skips it.
//
//	kube-stack image push --ref HOST:PORT/NAME:TAG [--from-dir DIR]... [--path HOSTPATH]... [--file SRC=DEST]...
//	                      [--debian-packages P1,P2] [--entrypoint CMD] [--cmd CMD] [--env K=V]... [--workdir DIR]
//
//   - --from-dir DIR: DIR's contents at the image's root;
//   - --path HOSTPATH: that file or directory (recursively) of this machine, at the same path;
//   - --file SRC=DEST: the host file SRC at DEST;
//   - --debian-packages: the files of these installed Debian packages and of everything they depend on
//     (Depends and Pre-Depends, the first installed alternative), documentation left out;
//   - --entrypoint, --cmd: a JSON array (["/bin/sh", "-c"]) or words split on spaces.
//
// Symbolic links among a path's parents (Debian's /bin -> usr/bin, /lib -> usr/lib) are kept as links.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// imageSpec: what an image is made of.
type imageSpec struct {
	Ref            string   // HOST:PORT/NAME:TAG
	Dirs           []string // contents at the root
	Paths          []string // host paths, recursively, at the same path
	Files          []string // SRC=DEST
	DebianPackages []string // with their dependencies' files
	Entrypoint     []string
	Cmd            []string
	Env            []string
	WorkingDir     string
}

// pushedImage: the result of a push.
type pushedImage struct {
	Ref, Digest          string
	LayerBytes, TarBytes int64
	Files                int
}

// A fixed time for every entry (2026-01-01), so that a layer's digest depends on its files only.
var layerTime = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func imageCommand(args []string) int {
	if len(args) == 0 || args[0] != "push" {
		fmt.Fprintln(os.Stderr, "usage: kube-stack image push --ref HOST:PORT/NAME:TAG [--from-dir DIR]... [--path P]... "+
			"[--file SRC=DEST]... [--debian-packages P1,P2] [--entrypoint CMD] [--cmd CMD] [--env K=V]... [--workdir DIR]")
		return 2
	}
	var spec imageSpec
	args = args[1:]
	for len(args) > 0 {
		flag, val, hasVal := strings.Cut(args[0], "=")
		if !hasVal {
			if len(args) < 2 {
				fmt.Fprintf(os.Stderr, "kube-stack image push: %s needs a value\n", args[0])
				return 2
			}
			val, args = args[1], args[1:]
		}
		args = args[1:]
		var err error
		switch flag {
		case "--ref":
			spec.Ref = val
		case "--from-dir":
			spec.Dirs = append(spec.Dirs, val)
		case "--path":
			spec.Paths = append(spec.Paths, val)
		case "--file":
			spec.Files = append(spec.Files, val)
		case "--debian-packages":
			spec.DebianPackages = append(spec.DebianPackages, strings.Split(val, ",")...)
		case "--entrypoint":
			spec.Entrypoint, err = commandWords(val)
		case "--cmd":
			spec.Cmd, err = commandWords(val)
		case "--env":
			spec.Env = append(spec.Env, val)
		case "--workdir":
			spec.WorkingDir = val
		default:
			fmt.Fprintf(os.Stderr, "kube-stack image push: unknown flag %s\n", flag)
			return 2
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "kube-stack image push: %s: %v\n", flag, err)
			return 2
		}
	}
	if spec.Ref == "" {
		fmt.Fprintln(os.Stderr, "kube-stack image push: --ref is needed")
		return 2
	}
	start := time.Now()
	img, err := pushImage(spec)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kube-stack image push: %v\n", err)
		return 1
	}
	fmt.Printf("%s@%s (%d files, layer %.1f MiB gzip'd, %.1f MiB as tar; %.1f s)\n", img.Ref, img.Digest, img.Files,
		float64(img.LayerBytes)/(1<<20), float64(img.TarBytes)/(1<<20), time.Since(start).Seconds())
	return 0
}

// commandWords: a JSON array of strings, or words split on white space.
func commandWords(s string) ([]string, error) {
	if strings.HasPrefix(strings.TrimSpace(s), "[") {
		var words []string
		err := json.Unmarshal([]byte(s), &words)
		return words, err
	}
	return strings.Fields(s), nil
}

// splitRef: "HOST:PORT/NAME:TAG" into the registry's address, the repository's name and the tag (default
// "latest").
func splitRef(ref string) (host, name, tag string, err error) {
	host, rest, ok := strings.Cut(ref, "/")
	if !ok || rest == "" {
		return "", "", "", fmt.Errorf("image reference %q: want HOST:PORT/NAME[:TAG]", ref)
	}
	name, tag = rest, "latest"
	if i := strings.LastIndex(rest, ":"); i > strings.LastIndex(rest, "/") {
		name, tag = rest[:i], rest[i+1:]
	}
	return host, name, tag, nil
}

// pushImage builds the image's layer into a temporary file, then pushes the layer, the config and the manifest.
func pushImage(spec imageSpec) (*pushedImage, error) {
	host, name, tag, err := splitRef(spec.Ref)
	if err != nil {
		return nil, err
	}
	tmp, err := os.CreateTemp("", "kube-stack-layer.*.tar.gz")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	layer, err := writeLayer(tmp, spec)
	if err != nil {
		return nil, err
	}
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      layerTime.Format(time.RFC3339),
		"config": map[string]any{
			"Entrypoint": spec.Entrypoint,
			"Cmd":        spec.Cmd,
			"Env":        append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, spec.Env...),
			"WorkingDir": spec.WorkingDir,
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{layer.diffID}},
		"history": []map[string]any{{"created": layerTime.Format(time.RFC3339), "created_by": "kube-stack image push"}},
	})
	if err != nil {
		return nil, err
	}
	configDigest := digestOf(config)
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config": map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json",
			"digest": configDigest, "size": len(config)},
		"layers": []map[string]any{{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
			"digest": layer.digest, "size": layer.size}},
	})
	if err != nil {
		return nil, err
	}
	r := &registryClient{base: "http://" + host, name: name,
		http: &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{Proxy: nil}}}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	if err := r.putBlob(layer.digest, tmp, layer.size); err != nil {
		return nil, err
	}
	if err := r.putBlob(configDigest, bytes.NewReader(config), int64(len(config))); err != nil {
		return nil, err
	}
	if err := r.putManifest(tag, manifest); err != nil {
		return nil, err
	}
	return &pushedImage{Ref: spec.Ref, Digest: digestOf(manifest), LayerBytes: layer.size, TarBytes: layer.tarSize,
		Files: layer.files}, nil
}

func digestOf(data []byte) string {
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

type registryClient struct {
	base, name string
	http       *http.Client
}

// putBlob uploads a blob in one PUT (a monolithic upload), unless the registry has it already.
func (r *registryClient) putBlob(digest string, body io.Reader, size int64) error {
	head, err := r.http.Head(r.base + "/v2/" + r.name + "/blobs/" + digest)
	if err == nil {
		head.Body.Close()
		if head.StatusCode == http.StatusOK {
			return nil
		}
	}
	resp, err := r.http.Post(r.base+"/v2/"+r.name+"/blobs/uploads/", "", nil)
	if err != nil {
		return fmt.Errorf("starting an upload to %s: %v", r.base, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("starting an upload to %s/%s: HTTP %s", r.base, r.name, resp.Status)
	}
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil {
		return fmt.Errorf("upload location %q: %v", resp.Header.Get("Location"), err)
	}
	base, _ := url.Parse(r.base + "/")
	loc = base.ResolveReference(loc)
	q := loc.Query()
	q.Set("digest", digest)
	loc.RawQuery = q.Encode()
	req, err := http.NewRequest(http.MethodPut, loc.String(), body)
	if err != nil {
		return err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err = r.http.Do(req)
	if err != nil {
		return fmt.Errorf("uploading %s: %v", digest, err)
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("uploading %s: HTTP %s: %s", digest, resp.Status, msg)
	}
	return nil
}

func (r *registryClient) putManifest(tag string, manifest []byte) error {
	req, err := http.NewRequest(http.MethodPut, r.base+"/v2/"+r.name+"/manifests/"+tag, bytes.NewReader(manifest))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
	resp, err := r.http.Do(req)
	if err != nil {
		return fmt.Errorf("pushing the manifest: %v", err)
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("pushing the manifest of %s:%s: HTTP %s: %s", r.name, tag, resp.Status, msg)
	}
	return nil
}

// ---- the layer

type layerInfo struct {
	digest, diffID string
	size, tarSize  int64
	files          int
}

// countingHash: a hash that also counts what went through it.
type countingHash struct {
	hash.Hash
	n int64
}

func (c *countingHash) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return c.Hash.Write(p)
}

// layerWriter writes a layer's tar: each path once, parents before children.
type layerWriter struct {
	tw   *tar.Writer
	seen map[string]bool
}

// writeLayer writes the gzip'd tar of spec's files to w.
func writeLayer(w io.Writer, spec imageSpec) (*layerInfo, error) {
	gzHash := &countingHash{Hash: sha256.New()}
	tarHash := &countingHash{Hash: sha256.New()}
	gz, err := gzip.NewWriterLevel(io.MultiWriter(w, gzHash), gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	lw := &layerWriter{tw: tar.NewWriter(io.MultiWriter(gz, tarHash)), seen: map[string]bool{}}
	if err := lw.addAll(spec); err != nil {
		return nil, err
	}
	if err := lw.tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	files := 0
	for range lw.seen {
		files++
	}
	return &layerInfo{digest: "sha256:" + hex.EncodeToString(gzHash.Sum(nil)),
		diffID: "sha256:" + hex.EncodeToString(tarHash.Sum(nil)), size: gzHash.n, tarSize: tarHash.n,
		files: files}, nil
}

func (lw *layerWriter) addAll(spec imageSpec) error {
	for _, dir := range spec.Dirs {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(dir, p)
			if err != nil || rel == "." {
				return err
			}
			return lw.addEntry(p, "/"+filepath.ToSlash(rel))
		})
		if err != nil {
			return err
		}
	}
	for _, f := range spec.Files {
		src, dest, ok := strings.Cut(f, "=")
		if !ok || !strings.HasPrefix(dest, "/") {
			return fmt.Errorf("--file %q: want SRC=/DEST", f)
		}
		if err := lw.addParentDirs(path.Dir(dest)); err != nil {
			return err
		}
		if err := lw.addEntry(src, dest); err != nil {
			return err
		}
	}
	var hostPaths []string
	for _, p := range spec.Paths {
		err := filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			hostPaths = append(hostPaths, q)
			return nil
		})
		if err != nil {
			return err
		}
	}
	if len(spec.DebianPackages) > 0 {
		files, err := debianFiles(spec.DebianPackages)
		if err != nil {
			return err
		}
		hostPaths = append(hostPaths, files...)
	}
	sort.Strings(hostPaths)
	for _, p := range hostPaths {
		if err := lw.addHostPath(p); err != nil {
			return err
		}
	}
	return nil
}

// addHostPath adds a host path at the same place, its parents first; a parent that is a symbolic link on this
// machine becomes the same link in the image, and the path goes where the link points.
func (lw *layerWriter) addHostPath(p string) error {
	p = filepath.Clean(p)
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%s: not an absolute path", p)
	}
	dir, err := lw.addHostParents(filepath.Dir(p), 0)
	if err != nil {
		return err
	}
	return lw.addEntry(p, filepath.Join(dir, filepath.Base(p)))
}

// addHostParents adds dir and its parents as they are on this machine, and returns the path dir resolves to.
func (lw *layerWriter) addHostParents(dir string, depth int) (string, error) {
	if depth > 16 {
		return "", fmt.Errorf("%s: too many symbolic links", dir)
	}
	if dir == "/" {
		return "/", nil
	}
	parent, err := lw.addHostParents(filepath.Dir(dir), depth)
	if err != nil {
		return "", err
	}
	here := filepath.Join(parent, filepath.Base(dir))
	st, err := os.Lstat(here)
	if err != nil {
		return "", err
	}
	if st.Mode()&fs.ModeSymlink == 0 {
		return here, lw.addEntry(here, here)
	}
	if err := lw.addEntry(here, here); err != nil {
		return "", err
	}
	target, err := os.Readlink(here)
	if err != nil {
		return "", err
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(parent, target)
	}
	return lw.addHostParents(filepath.Clean(target), depth+1)
}

// addParentDirs adds directories (0755) for an image path's parents that are not in the layer yet.
func (lw *layerWriter) addParentDirs(dir string) error {
	if dir == "/" || dir == "." || lw.seen[dir] {
		return nil
	}
	if err := lw.addParentDirs(path.Dir(dir)); err != nil {
		return err
	}
	lw.seen[dir] = true
	return lw.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(dir, "/") + "/",
		Mode: 0o755, ModTime: layerTime, Format: tar.FormatPAX})
}

// addEntry adds the host file src (not followed if a link) as the image path dest, once.
func (lw *layerWriter) addEntry(src, dest string) error {
	dest = path.Clean(filepath.ToSlash(dest))
	if lw.seen[dest] {
		return nil
	}
	if err := lw.addParentDirs(path.Dir(dest)); err != nil {
		return err
	}
	st, err := os.Lstat(src)
	if err != nil {
		return err
	}
	lw.seen[dest] = true
	link := ""
	if st.Mode()&fs.ModeSymlink != 0 {
		if link, err = os.Readlink(src); err != nil {
			return err
		}
	}
	hdr, err := tar.FileInfoHeader(st, link)
	if err != nil {
		return err
	}
	hdr.Name = strings.TrimPrefix(dest, "/")
	if st.IsDir() {
		hdr.Name += "/"
	}
	hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "root", "root"
	hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = layerTime, time.Time{}, time.Time{}
	hdr.Format = tar.FormatPAX
	switch {
	case st.Mode().IsRegular(), st.IsDir(), st.Mode()&fs.ModeSymlink != 0:
	default:
		return nil // devices, sockets, pipes: not in an image
	}
	if err := lw.tw.WriteHeader(hdr); err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return nil
	}
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := io.CopyN(lw.tw, f, st.Size()); err != nil {
		return fmt.Errorf("%s: %v", src, err)
	}
	return nil
}

// ---- Debian packages

// Documentation and translations are left out of images.
var debianSkip = []string{"/usr/share/doc/", "/usr/share/man/", "/usr/share/info/", "/usr/share/locale/",
	"/usr/share/lintian/", "/usr/share/bug/"}

// debianFiles: the files (and directories) of the installed packages and of all they depend on.
func debianFiles(pkgs []string) ([]string, error) {
	all, err := debianClosure(pkgs)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command("dpkg", append([]string{"-L"}, all...)...).Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg -L %s: %v", strings.Join(all, " "), err)
	}
	var files []string
	seen := map[string]bool{}
next:
	for _, f := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(f, "/") || f == "/." || seen[f] {
			continue
		}
		for _, skip := range debianSkip {
			if strings.HasPrefix(f+"/", skip) {
				continue next
			}
		}
		if _, err := os.Lstat(f); err != nil {
			continue // a diverted or removed file
		}
		seen[f] = true
		files = append(files, f)
	}
	return files, nil
}

// debianClosure: the packages and, recursively, their installed Depends and Pre-Depends (for an alternative,
// the first one installed; a virtual package, the first installed package that provides it).
func debianClosure(pkgs []string) ([]string, error) {
	installed, provides, err := debianInstalled()
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var order []string
	var visit func(string) error
	visit = func(p string) error {
		if seen[p] {
			return nil
		}
		deps, ok := installed[p]
		if !ok {
			return fmt.Errorf("Debian package %s is not installed", p)
		}
		seen[p] = true
		order = append(order, p)
		for _, group := range strings.Split(deps, ",") {
			group = strings.TrimSpace(group)
			if group == "" {
				continue
			}
			chosen := ""
			for _, alt := range strings.Split(group, "|") {
				n := strings.Fields(alt)[0]
				n, _, _ = strings.Cut(n, ":") // ":any"
				if _, ok := installed[n]; ok {
					chosen = n
					break
				}
				if by := provides[n]; by != "" {
					chosen = by
					break
				}
			}
			if chosen == "" {
				return fmt.Errorf("Debian package %s needs %q: nothing installed satisfies it", p, group)
			}
			if err := visit(chosen); err != nil {
				return err
			}
		}
		return nil
	}
	for _, p := range pkgs {
		if p = strings.TrimSpace(p); p != "" {
			if err := visit(p); err != nil {
				return nil, err
			}
		}
	}
	return order, nil
}

// debianInstalled: every installed package's Depends and Pre-Depends, and who provides each virtual package.
func debianInstalled() (map[string]string, map[string]string, error) {
	out, err := exec.Command("dpkg-query", "-W",
		"-f", "${Package}\t${db:Status-Abbrev}\t${Depends}, ${Pre-Depends}\t${Provides}\n").Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, nil, fmt.Errorf("dpkg-query: %v: %s", err, ee.Stderr)
		}
		return nil, nil, fmt.Errorf("dpkg-query: %v", err)
	}
	installed, provides := map[string]string{}, map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 4 || !strings.HasPrefix(f[1], "ii") {
			continue
		}
		installed[f[0]] = f[2]
		for _, p := range strings.Split(f[3], ",") {
			if p = strings.TrimSpace(p); p != "" {
				name := strings.Fields(p)[0]
				if provides[name] == "" {
					provides[name] = f[0]
				}
			}
		}
	}
	return installed, provides, nil
}
