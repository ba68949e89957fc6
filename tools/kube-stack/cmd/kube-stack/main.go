// Command kube-stack builds, starts and checks the Kubernetes test stack (tools/kube-stack/README.md):
//
//	kube-stack [-root DIR] with-kube [--without-kueue] [--real-nodes N] CMD...   build what is missing, start the stack, run CMD
//	kube-stack [-root DIR] with-kube [--without-kueue] [--real-nodes N] --build-only
//	kube-stack [-root DIR] smoke [--real-only]   the stack's contract (run under with-kube)
//	kube-stack [-root DIR] deploy-check   deploy/kubernetes/ against the stack's API server (run under with-kube)
//	kube-stack [-root DIR] key            the build cache dir's name, and the dir
//	kube-stack image push --ref HOST:PORT/NAME:TAG ...   build an image from this machine's files and push it
//
// DIR is the repository's root (default: the nearest directory above the working directory that holds
// tools/kube-stack/stages). scripts/with-kube, scripts/kube-smoke and scripts/kube-deploy-check run it through
// scripts/kube-stack, which builds it into the stack's cache dir whenever its sources change.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

const usage = `usage: kube-stack [-root DIR] with-kube [--without-kueue] [--real-nodes N] CMD...
       kube-stack [-root DIR] with-kube [--without-kueue] [--real-nodes N] --build-only
       kube-stack [-root DIR] smoke | deploy-check | key
       kube-stack image push --ref HOST:PORT/NAME:TAG [--from-dir DIR]... [--path P]... [--file SRC=DEST]...
                             [--debian-packages P1,P2] [--entrypoint CMD] [--cmd CMD] [--env K=V]... [--workdir DIR]`

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	root := ""
	for len(args) > 0 && strings.HasPrefix(args[0], "-root") {
		switch {
		case args[0] == "-root" && len(args) > 1:
			root, args = args[1], args[2:]
		case strings.HasPrefix(args[0], "-root="):
			root, args = strings.TrimPrefix(args[0], "-root="), args[1:]
		default:
			fmt.Fprintln(os.Stderr, usage)
			return 2
		}
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, usage)
		return 2
	}
	if args[0] == "image" { // needs no checkout
		return imageCommand(args[1:])
	}
	if root == "" {
		var err error
		if root, err = findRoot(); err != nil {
			fmt.Fprintf(os.Stderr, "kube-stack: %v\n", err)
			return 2
		}
	}
	root, _ = filepath.Abs(root)
	switch args[0] {
	case "with-kube":
		return withKube(root, args[1:])
	case "smoke":
		return smoke(args[1:])
	case "deploy-check":
		return deployCheck(root)
	case "key":
		key, err := cacheKey(filepath.Join(root, "tools", "kube-stack"))
		if err != nil {
			fmt.Fprintf(os.Stderr, "kube-stack: %v\n", err)
			return 1
		}
		fmt.Printf("%s %s\n", key, filepath.Join(cacheRoot(), key))
		return 0
	}
	fmt.Fprintln(os.Stderr, usage)
	return 2
}

// findRoot walks up from the working directory to the repository root (the dir holding tools/kube-stack/stages).
func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if st, err := os.Stat(filepath.Join(dir, "tools", "kube-stack", "stages")); err == nil && st.IsDir() {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no tools/kube-stack above the working directory: pass -root DIR")
		}
		dir = parent
	}
}

// env is os.Getenv with a default for unset or empty variables (the shell's ${NAME:-default}).
func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// cacheRoot is where built binaries go (one dir per cache key under it).
func cacheRoot() string {
	return env("TRAINYARD_KUBE_CACHE", "/var/cache/trainyard/kube-stack")
}
