package main

// with-kube: runs a command against a throwaway Kubernetes control plane on 127.0.0.1 with simulated nodes.
//
// The stack: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok with the Stages in
// tools/kube-stack/stages/, the Kubeflow training operator (PyTorchJob only), the KubeRay operator with its Ray
// dashboard stand-in (tools/kube-stack/ray-dashboard-sim), and Kueue unless --without-kueue, with their CRDs.
// CMD sees KUBECONFIG (admin bearer token, group system:masters), TRAINYARD_KUBE_STACK (the stack's dir:
// logs/, pki/, kubeconfig, env), TRAINYARD_KUBE_BIN (the binaries, also put first on PATH, kubectl included).
// The stack creates no kwok node. With --real-nodes N it also runs N real nodes (kubelets with containerd on
// this machine, nodes.go) and CMD sees TRAINYARD_KUBE_REAL_NODES, TRAINYARD_KUBE_REGISTRY,
// TRAINYARD_KUBE_BASE_IMAGE and TRAINYARD_KUBE_PAUSE_IMAGE too. On CMD's failure the logs' tails are printed and the stack's dir is kept
// (TRAINYARD_KUBE_KEEP=1 keeps it always, TRAINYARD_KUBE_TAIL=N sets the tails' length). INT or TERM stops CMD,
// then the stack, and removes the stack's dir.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "with-kube: "+format+"\n", args...)
}

func withKube(root string, args []string) int {
	buildOnly := false
	withKueue := env("TRAINYARD_KUBE_WITH_KUEUE", "1") == "1"
	realNodes := 0
loop:
	for len(args) > 0 {
		switch {
		case args[0] == "--real-nodes" && len(args) > 1, strings.HasPrefix(args[0], "--real-nodes="):
			v := strings.TrimPrefix(args[0], "--real-nodes=")
			if args[0] == "--real-nodes" {
				v, args = args[1], args[1:]
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > maxRealNodes {
				say("--real-nodes: a number from 0 to %d, not %q", maxRealNodes, v)
				return 2
			}
			realNodes = n
			args = args[1:]
			continue
		}
		switch args[0] {
		case "--build-only":
			buildOnly = true
		case "--with-kueue":
			withKueue = true
		case "--without-kueue":
			withKueue = false
		case "--":
			args = args[1:]
			break loop
		default:
			break loop
		}
		args = args[1:]
	}
	if !buildOnly && len(args) == 0 {
		fmt.Fprintln(os.Stderr,
			"usage: scripts/with-kube [--without-kueue] [--real-nodes N] CMD... | scripts/with-kube [--without-kueue] [--real-nodes N] --build-only")
		return 2
	}
	if _, err := exec.LookPath("go"); err != nil {
		say("Go is needed to build the stack (Go 1.26; the machines have it in /usr/local/go/bin)")
		return 1
	}
	ks := filepath.Join(root, "tools", "kube-stack")
	key, err := cacheKey(ks)
	if err != nil {
		say("%v", err)
		return 1
	}
	b := newBuilder(ks, key)
	if err := b.buildAll(withKueue); err != nil {
		say("%v", err)
		return 1
	}
	var nb, pb *builder
	if realNodes > 0 {
		var err error
		if nb, err = buildSub(ks, "nodes", nodeComponents); err == nil {
			pb, err = buildSub(ks, "netpol", netpolComponents)
		}
		if err != nil {
			say("%v", err)
			return 1
		}
	}
	if buildOnly {
		say("binaries in %s", b.bin)
		if nb != nil {
			say("real nodes' binaries in %s and %s", nb.bin, pb.bin)
		}
		return 0
	}
	s := &stack{ks: ks, cache: b.cache, bin: b.bin, withKueue: withKueue, realNodes: realNodes}
	if nb != nil {
		s.nodeBin, s.netpolBin = nb.bin, pb.bin
	}
	return s.run(args)
}

type stack struct {
	ks, cache, bin string
	withKueue      bool
	realNodes      int    // --real-nodes N
	nodeBin        string // the real nodes' binaries (kubelet, kube-proxy, coredns, pause, cni/)
	netpolBin      string // their NetworkPolicy enforcement (kube-router)
	nodes          *realNodes
	dir, pki       string
	t0             time.Time
	procs          []*proc
	kubectl        []string
	adminToken     string
	apiURL         string

	// Signals: the first INT or TERM cancels ctx (start-up stops); every one is passed on to CMD once it runs.
	ctx      context.Context
	mu       sync.Mutex
	signal   os.Signal
	cmd      *exec.Cmd
	cmdStart bool
}

// failure: start-up failed; its message is said, the exit code is 1, and the logs' tails follow.
type failure struct{ msg string }

func (f failure) Error() string { return f.msg }

func die(format string, args ...any) error { return failure{fmt.Sprintf(format, args...)} }

var errSignalled = errors.New("signalled")

func (s *stack) run(args []string) int {
	s.t0 = time.Now()
	dir, err := os.MkdirTemp(os.TempDir(), "trainyard-kube.")
	if err != nil {
		say("%v", err)
		return 1
	}
	s.dir, s.pki = dir, filepath.Join(dir, "pki")
	for _, d := range []string{"logs", "pki", "etcd", "home"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			say("%v", err)
			return 1
		}
	}
	var cancel context.CancelFunc
	s.ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	sigc := make(chan os.Signal, 4)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigc)
	go func() {
		for sig := range sigc {
			say("got SIG%s, stopping", signalName(sig))
			s.mu.Lock()
			if s.signal == nil {
				s.signal = sig
			}
			if s.cmdStart {
				s.cmd.Process.Signal(sig)
			}
			s.mu.Unlock()
			cancel()
		}
	}()

	rc := 0
	if err := s.start(); err != nil {
		if f, ok := err.(failure); ok {
			say("%s", f.msg)
		} else if err != errSignalled {
			say("%v", err)
		}
		rc = 1
	} else {
		rc = s.runCommand(args)
	}
	s.mu.Lock()
	sig := s.signal
	s.mu.Unlock()
	signalled := sig != nil
	if signalled {
		rc = 128 + int(sig.(syscall.Signal))
	}
	return s.finish(rc, signalled)
}

func signalName(sig os.Signal) string {
	if sig == syscall.SIGINT {
		return "INT"
	}
	return "TERM"
}

// runCommand runs CMD with the stack's environment and our stdin, and returns its exit code.
func (s *stack) runCommand(args []string) int {
	cmd := exec.Command(args[0], args[1:]...) // looked up on the PATH that has the stack's bin first
	if _, err := os.Stdin.Stat(); err == nil {
		cmd.Stdin = os.Stdin
	}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	s.mu.Lock()
	if s.signal != nil {
		s.mu.Unlock()
		return 1
	}
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		say("%s: %v", args[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return 127
		}
		return 126
	}
	s.cmd, s.cmdStart = cmd, true
	s.mu.Unlock()
	cmd.Wait()
	rc := exitCode(cmd.ProcessState)
	s.mu.Lock()
	signalled := s.signal != nil
	s.mu.Unlock()
	if rc != 0 && !signalled {
		say("command failed with exit code %d", rc)
	}
	return rc
}

// exitCode as a shell gives it: the exit status, or 128 + the signal that ended the process.
func exitCode(st *os.ProcessState) int {
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}

// finish stops the stack, and keeps its dir after a failure that was not asked for (or with TRAINYARD_KUBE_KEEP=1).
func (s *stack) finish(rc int, signalled bool) int {
	s.stop()
	s.nodes.cleanup()
	os.RemoveAll(filepath.Join(s.dir, "etcd"))
	// Stopped by INT or TERM: asked for, not a failure (nothing to show, nothing to keep).
	if (rc != 0 && !signalled) || env("TRAINYARD_KUBE_KEEP", "0") == "1" {
		if rc != 0 {
			s.printTails()
		}
		// The real nodes' images and the registry's copies (gigabytes a run) go; the logs and configs stay.
		s.nodes.dropImages()
		say("stack dir kept: %s (logs in %s/logs)", s.dir, s.dir)
	} else {
		os.RemoveAll(s.dir)
	}
	return rc
}
