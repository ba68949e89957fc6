package main

// The stack's components as processes: each started with its log and pid file, waited for until it answers,
// stopped in order; kubectl run as admin; the logs' tails shown after a failure.

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A component: its process, and done closed once it has exited (and been reaped).
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// stop: TERM to every component, last started first; then each gets stopGrace to exit before a KILL.
func (s *stack) stop() {
	for i := len(s.procs) - 1; i >= 0; i-- {
		s.procs[i].cmd.Process.Signal(syscall.SIGTERM)
	}
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		select {
		case <-p.done:
		case <-time.After(stopGrace):
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	s.procs = nil
}

func (s *stack) printTails() {
	n, err := strconv.Atoi(env("TRAINYARD_KUBE_TAIL", "25"))
	if err != nil || n < 0 {
		n = 25
	}
	logs, _ := filepath.Glob(filepath.Join(s.dir, "logs", "*.log"))
	for _, f := range logs {
		fmt.Fprintf(os.Stderr, "----- tail of %s\n", f)
		os.Stderr.Write(tail(f, n))
	}
}

// tail: a file's last n lines (read from its end, the logs can be large), ending with a newline.
func tail(path string, n int) []byte {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	const block = 64 << 10
	var buf []byte
	for off := st.Size(); off > 0; {
		start := max(off-block, 0)
		chunk := make([]byte, off-start)
		if _, err := f.ReadAt(chunk, start); err != nil && err != io.EOF {
			return nil
		}
		buf = append(chunk, buf...)
		off = start
		// n lines need n newlines before them (the last line's own newline does not count).
		if bytes.Count(bytes.TrimSuffix(buf, []byte("\n")), []byte("\n")) >= n {
			break
		}
	}
	if n == 0 || len(buf) == 0 {
		return nil
	}
	body := bytes.TrimSuffix(buf, []byte("\n"))
	lines := bytes.Split(body, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return append(bytes.Join(lines, []byte("\n")), '\n')
}

func (s *stack) since() string { return fmt.Sprintf("%.1f", time.Since(s.t0).Seconds()) }

func (s *stack) path(elem ...string) string {
	return filepath.Join(append([]string{s.dir}, elem...)...)
}

// startProc starts a component with its stdout and stderr in logs/<name>.log, its pid in <name>.pid. It gets a
// process group of its own, so that a terminal's INT reaches only with-kube (and CMD), which stops the
// components in order.
func (s *stack) startProc(name string, extraEnv []string, argv ...string) error {
	log, err := os.Create(s.path("logs", name+".log"))
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), extraEnv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return die("%s could not be started: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	s.procs = append(s.procs, p)
	return os.WriteFile(s.path(name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o644)
}

// alive fails when the component has exited.
func (s *stack) alive(name string) error {
	for _, p := range s.procs {
		if p.name != name {
			continue
		}
		select {
		case <-p.done:
			return die("%s exited during start-up (log: %s)", name, s.path("logs", name+".log"))
		default:
		}
	}
	return nil
}

// waitFor polls check every 0.2 s until it passes, failing when the component exits or after limitS seconds.
func (s *stack) waitFor(name string, limitS int, check func() bool) error {
	deadline := time.Now().Add(time.Duration(limitS) * time.Second)
	for !check() {
		if err := s.alive(name); err != nil {
			return err
		}
		if !time.Now().Before(deadline) {
			return die("%s not ready after %ds (log: %s)", name, limitS, s.path("logs", name+".log"))
		}
		select {
		case <-s.ctx.Done():
			return errSignalled
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

// httpOK: whether a GET of url answers below 400 (curl -f). With ca, the server is verified against it and
// the admin token is sent; without, the server's certificate is not checked (curl -k). No proxy is used.
func (s *stack) httpOK(url string, ca *x509.CertPool) func() bool {
	tlsConfig := &tls.Config{InsecureSkipVerify: ca == nil, RootCAs: ca}
	client := &http.Client{
		Timeout:   checkTimeout,
		Transport: &http.Transport{TLSClientConfig: tlsConfig, DisableKeepAlives: true, Proxy: nil},
	}
	return func() bool {
		req, err := http.NewRequestWithContext(s.ctx, http.MethodGet, url, nil)
		if err != nil {
			return false
		}
		if ca != nil {
			req.Header.Set("Authorization", "Bearer "+s.adminToken)
		}
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode < 400
	}
}

// kube runs kubectl as admin with stdin, its output appended to logs/crds.log.
func (s *stack) kube(stdin string, args ...string) error {
	log, err := os.OpenFile(s.path("logs", "crds.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.CommandContext(s.ctx, s.kubectl[0], append(s.kubectl[1:], args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = log, log
	err = cmd.Run()
	if s.ctx.Err() != nil {
		return errSignalled
	}
	return err
}

func (s *stack) crdsLog() string {
	data, _ := os.ReadFile(s.path("logs", "crds.log"))
	return string(data)
}

// freePorts: n free loopback ports, all bound at once so that they differ from each other. They are taken below
// the kernel's ephemeral range: a port from that range, free when looked at, can be taken before its component
// binds it as the local end of any outgoing connection (kubectl's, the API server's own), and the component
// then exits with "address already in use" (seen with the private registry).
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	low, high := portsBelowEphemeral()
	for tries := 0; len(ports) < n; tries++ {
		addr := "127.0.0.1:0"
		if high > low && tries < 64*n {
			addr = "127.0.0.1:" + strconv.Itoa(low+rand.IntN(high-low))
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			if addr == "127.0.0.1:0" {
				return nil, err
			}
			continue
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// portsBelowEphemeral: the range [low, high) the stack takes its ports from, below the kernel's ephemeral
// ports (net.ipv4.ip_local_port_range); empty when that range starts too low to leave room.
func portsBelowEphemeral() (int, int) {
	first := 32768
	if data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil {
				first = v
			}
		}
	}
	const low = 20000
	if first-low < 1000 {
		return 0, 0
	}
	return low, first
}
