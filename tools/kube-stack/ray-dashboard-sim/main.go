// ray-dashboard-sim stands in for the Ray dashboard's job API (/api/jobs/) of every RayCluster in the test stack,
// where no Ray head really runs (kwok simulates the pods), and for the pod network (podnet.go).
//
// The KubeRay operator reaches a cluster's dashboard at http://<head-service>.<namespace>.svc.cluster.local:8265
// with a plain net/http client, which honours HTTP_PROXY: scripts/with-kube starts the operator with
// HTTP_PROXY pointing here, so those requests arrive at this server in proxy form and their Host names the
// namespace. Nothing is resolved or dialled beyond loopback.
//
// A cluster whose head is a real pod (the stack's real nodes, --real-cidr) has a real dashboard: requests for its
// head service are passed on to the head pod's address (the host routes the real nodes' pod network), so
// KubeRay drives a real Ray job. Only the simulated heads are answered here.
//
// A job submitted here (HTTPMode) runs as the sim labels of its RayJob say (metadata labels, else the head pod
// template's labels): sim.trainyard.dev/run-ms (no label: runs until stopped), then SUCCEEDED, or FAILED with
// sim.trainyard.dev/exit-code != 0 or sim.trainyard.dev/oom = "true". The labels are read from the API server.
package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

type job struct {
	Namespace  string
	Submission string
	Entrypoint string
	Metadata   map[string]string
	RuntimeEnv json.RawMessage
	Start      time.Time
	Stopped    *time.Time
	// From the RayJob's labels, once found.
	Labels map[string]string
}

type server struct {
	mu     sync.Mutex
	jobs   map[string]*job // namespace/submission id
	api    string
	token  string
	client *http.Client
	net    *podNet
	// The real nodes' pod network (nil: none) and, per <namespace>/<service>, the real pod behind it.
	realCIDR *net.IPNet
	realMu   sync.Mutex
	real     map[string]realHead
}

type realHead struct {
	ip   string // "" when the service has no real pod
	seen time.Time
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to listen on")
	api := flag.String("api-server", "", "API server URL")
	token := flag.String("token", "", "bearer token for the API server")
	ca := flag.String("ca", "", "CA certificate file of the API server")
	podCIDR := flag.String("pod-cidr", "", "the simulated pods' address range (CONNECT tunnels there reach them)")
	egress := flag.String("egress-socket", "", "a unix socket to serve too (the API server's egress proxy)")
	realCIDR := flag.String("real-cidr", "", "the real nodes' pod network: heads there are real and passed on to")
	flag.Parse()

	pool := x509.NewCertPool()
	if *ca != "" {
		pem, err := os.ReadFile(*ca)
		if err != nil {
			log.Fatal(err)
		}
		pool.AppendCertsFromPEM(pem)
	}
	s := &server{
		jobs:  map[string]*job{},
		api:   strings.TrimSuffix(*api, "/"),
		token: *token,
		client: &http.Client{
			Timeout:   5 * time.Second,
			Transport: &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: pool}},
		},
	}
	s.net = &podNet{s: s, scrapes: map[string]int{}}
	s.real = map[string]realHead{}
	if *realCIDR != "" {
		_, cidr, err := net.ParseCIDR(*realCIDR)
		if err != nil {
			log.Fatal(err)
		}
		s.realCIDR = cidr
	}
	if *podCIDR != "" {
		_, cidr, err := net.ParseCIDR(*podCIDR)
		if err != nil {
			log.Fatal(err)
		}
		s.net.cidr = cidr
	}
	if *egress != "" {
		_ = os.Remove(*egress)
		l, err := net.Listen("unix", *egress)
		if err != nil {
			log.Fatal(err)
		}
		go func() { log.Fatal(http.Serve(l, s)) }()
	}
	log.Printf("ray dashboard and pod network stand-in listening on %s", *listen)
	log.Fatal(http.ListenAndServe(*listen, s))
}

// namespaceOf reads <service>.<namespace>.svc... from the request's host.
func namespaceOf(r *http.Request) string {
	host := r.Host
	if r.URL.Host != "" {
		host = r.URL.Host
	}
	if i := strings.LastIndex(host, ":"); i >= 0 {
		host = host[:i]
	}
	parts := strings.Split(host, ".")
	if len(parts) >= 3 && parts[2] == "svc" {
		return parts[1]
	}
	return ""
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		s.net.connect(w, r)
		return
	}
	if r.URL.Path == "/healthz" {
		reply(w, 200, map[string]string{"status": "ok"})
		return
	}
	if ip, port := s.realHeadOf(r); ip != "" {
		target := &url.URL{Scheme: "http", Host: net.JoinHostPort(ip, port)}
		log.Printf("%s %s (host %s) passed on to the real head at %s", r.Method, r.URL.Path, r.Host, target.Host)
		proxy := httputil.NewSingleHostReverseProxy(target)
		proxy.Transport = &http.Transport{Proxy: nil}
		proxy.ServeHTTP(w, r)
		return
	}
	ns := namespaceOf(r)
	log.Printf("%s %s (host %s, namespace %q)", r.Method, r.URL.Path, r.Host, ns)
	if ns == "" || !strings.HasPrefix(r.URL.Path, "/api/jobs/") {
		reply(w, 404, map[string]string{"error": "not found"})
		return
	}
	rest := strings.Trim(strings.TrimPrefix(r.URL.Path, "/api/jobs/"), "/")
	parts := strings.Split(rest, "/")
	switch {
	case rest == "" && r.Method == http.MethodPost:
		s.submit(w, r, ns)
	case rest == "" && r.Method == http.MethodGet:
		s.list(w, ns)
	case len(parts) == 1 && r.Method == http.MethodGet:
		s.info(w, ns, parts[0])
	case len(parts) == 1 && r.Method == http.MethodDelete:
		s.mu.Lock()
		_, ok := s.jobs[ns+"/"+parts[0]]
		delete(s.jobs, ns+"/"+parts[0])
		s.mu.Unlock()
		if !ok {
			reply(w, 404, map[string]string{"error": "job not found"})
			return
		}
		reply(w, 200, map[string]bool{"deleted": true})
	case len(parts) == 2 && parts[1] == "stop" && r.Method == http.MethodPost:
		s.mu.Lock()
		j, ok := s.jobs[ns+"/"+parts[0]]
		if ok && j.Stopped == nil {
			now := time.Now()
			j.Stopped = &now
		}
		s.mu.Unlock()
		if !ok {
			reply(w, 404, map[string]string{"error": "job not found"})
			return
		}
		reply(w, 200, map[string]bool{"stopped": true})
	case len(parts) == 2 && parts[1] == "logs" && r.Method == http.MethodGet:
		s.mu.Lock()
		j, ok := s.jobs[ns+"/"+parts[0]]
		s.mu.Unlock()
		if !ok {
			reply(w, 404, map[string]string{"error": "job not found"})
			return
		}
		reply(w, 200, map[string]string{"logs": fmt.Sprintf("simulated Ray job %s: %s\n", j.Submission, j.Entrypoint)})
	default:
		reply(w, 404, map[string]string{"error": "not found"})
	}
}

func (s *server) submit(w http.ResponseWriter, r *http.Request, ns string) {
	var req struct {
		Entrypoint   string            `json:"entrypoint"`
		SubmissionID string            `json:"submission_id"`
		Metadata     map[string]string `json:"metadata"`
		RuntimeEnv   json.RawMessage   `json:"runtime_env"`
	}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil || req.Entrypoint == "" {
		reply(w, 400, map[string]string{"error": "bad job request"})
		return
	}
	if req.SubmissionID == "" {
		req.SubmissionID = fmt.Sprintf("raysubmit_%d", time.Now().UnixNano())
	}
	key := ns + "/" + req.SubmissionID
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.jobs[key]; ok {
		// The real dashboard's answer, which the operator recognises.
		reply(w, 500, map[string]string{"error": "Job with submission_id " + req.SubmissionID +
			" already exists. Please use a different submission_id."})
		return
	}
	s.jobs[key] = &job{Namespace: ns, Submission: req.SubmissionID, Entrypoint: req.Entrypoint,
		Metadata: req.Metadata, RuntimeEnv: req.RuntimeEnv, Start: time.Now()}
	reply(w, 200, map[string]string{"job_id": req.SubmissionID, "submission_id": req.SubmissionID})
}

func (s *server) list(w http.ResponseWriter, ns string) {
	s.mu.Lock()
	var keys []string
	for k, j := range s.jobs {
		if j.Namespace == ns {
			keys = append(keys, k)
		}
	}
	s.mu.Unlock()
	out := []map[string]any{}
	for _, k := range keys {
		if info := s.infoOf(k); info != nil {
			out = append(out, info)
		}
	}
	reply(w, 200, out)
}

func (s *server) info(w http.ResponseWriter, ns, id string) {
	info := s.infoOf(ns + "/" + id)
	if info == nil {
		reply(w, 404, map[string]string{"error": "job " + id + " does not exist"})
		return
	}
	reply(w, 200, info)
}

func (s *server) infoOf(key string) map[string]any {
	s.mu.Lock()
	j, ok := s.jobs[key]
	s.mu.Unlock()
	if !ok {
		return nil
	}
	labels := s.labelsOf(j)
	ms := func(t time.Time) uint64 { return uint64(t.UnixMilli()) }
	info := map[string]any{
		"type": "SUBMISSION", "job_id": j.Submission, "submission_id": j.Submission,
		"entrypoint": j.Entrypoint, "metadata": j.Metadata, "start_time": ms(j.Start),
	}
	if len(j.RuntimeEnv) > 0 {
		info["runtime_env"] = j.RuntimeEnv
	}
	status, message := "RUNNING", "simulated: running"
	var end time.Time
	runMs, err := strconv.Atoi(labels["sim.trainyard.dev/run-ms"])
	switch {
	case j.Stopped != nil:
		status, message, end = "STOPPED", "simulated: stopped", *j.Stopped
	case err == nil && time.Since(j.Start) >= time.Duration(runMs)*time.Millisecond:
		end = j.Start.Add(time.Duration(runMs) * time.Millisecond)
		code := labels["sim.trainyard.dev/exit-code"]
		switch {
		case labels["sim.trainyard.dev/oom"] == "true":
			status, message = "FAILED", "simulated: the job's driver was OOM-killed (exit code 137)"
			info["driver_exit_code"] = 137
		case code != "" && code != "0":
			n, _ := strconv.Atoi(code)
			status, message = "FAILED", fmt.Sprintf("simulated: job entrypoint command failed with exit code %d", n)
			info["driver_exit_code"] = n
			info["error_type"] = "JOB_ENTRYPOINT_COMMAND_ERROR"
		default:
			status, message = "SUCCEEDED", "simulated: job finished successfully"
			info["driver_exit_code"] = 0
		}
	}
	info["status"], info["message"] = status, message
	if !end.IsZero() {
		info["end_time"] = ms(end)
	}
	return info
}

// labelsOf finds the RayJob whose status.jobId is this submission and returns its sim labels (its own labels,
// else those of its head pod template). Cached once found.
func (s *server) labelsOf(j *job) map[string]string {
	s.mu.Lock()
	if j.Labels != nil {
		defer s.mu.Unlock()
		return j.Labels
	}
	s.mu.Unlock()
	if s.api == "" {
		return map[string]string{}
	}
	req, _ := http.NewRequest(http.MethodGet, s.api+"/apis/ray.io/v1/namespaces/"+url.PathEscape(j.Namespace)+"/rayjobs", nil)
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.client.Do(req)
	if err != nil {
		log.Printf("listing RayJobs: %v", err)
		return map[string]string{}
	}
	defer resp.Body.Close()
	var list struct {
		Items []struct {
			Metadata struct {
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec struct {
				RayClusterSpec struct {
					HeadGroupSpec struct {
						Template struct {
							Metadata struct {
								Labels map[string]string `json:"labels"`
							} `json:"metadata"`
						} `json:"template"`
					} `json:"headGroupSpec"`
				} `json:"rayClusterSpec"`
			} `json:"spec"`
			Status struct {
				JobID string `json:"jobId"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		log.Printf("decoding RayJobs: %v", err)
		return map[string]string{}
	}
	for _, it := range list.Items {
		if it.Status.JobID != j.Submission {
			continue
		}
		found := map[string]string{}
		for _, src := range []map[string]string{it.Spec.RayClusterSpec.HeadGroupSpec.Template.Metadata.Labels, it.Metadata.Labels} {
			for k, v := range src {
				if strings.HasPrefix(k, "sim.trainyard.dev/") {
					found[k] = v
				}
			}
		}
		s.mu.Lock()
		j.Labels = found
		s.mu.Unlock()
		return found
	}
	return map[string]string{}
}

// realHeadOf finds the real pod behind the service a proxied request names (<service>.<namespace>.svc...:PORT):
// its address and the port, or "" when the service's pods are simulated (or there are no real nodes). Looked
// up through the API server (the service's selector, then its pods), remembered for 5 s.
func (s *server) realHeadOf(r *http.Request) (string, string) {
	if s.realCIDR == nil || s.api == "" {
		return "", ""
	}
	host := r.URL.Host
	if host == "" {
		host = r.Host
	}
	h, port, err := net.SplitHostPort(host)
	if err != nil {
		return "", ""
	}
	parts := strings.Split(h, ".")
	if len(parts) < 3 || parts[2] != "svc" {
		return "", ""
	}
	svc, ns := parts[0], parts[1]
	key := ns + "/" + svc
	s.realMu.Lock()
	if c, ok := s.real[key]; ok && time.Since(c.seen) < 5*time.Second {
		s.realMu.Unlock()
		return c.ip, port
	}
	s.realMu.Unlock()
	ip := s.lookupRealPod(ns, svc)
	s.realMu.Lock()
	s.real[key] = realHead{ip: ip, seen: time.Now()}
	s.realMu.Unlock()
	return ip, port
}

func (s *server) getJSON(path string, v any) error {
	req, _ := http.NewRequest(http.MethodGet, s.api+path, nil)
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// lookupRealPod: the address of a running pod the service selects that is on the real nodes' network, or "".
func (s *server) lookupRealPod(ns, svc string) string {
	var service struct {
		Spec struct {
			Selector map[string]string `json:"selector"`
		} `json:"spec"`
	}
	if err := s.getJSON("/api/v1/namespaces/"+url.PathEscape(ns)+"/services/"+url.PathEscape(svc), &service); err != nil {
		log.Printf("finding service %s/%s: %v", ns, svc, err)
		return ""
	}
	if len(service.Spec.Selector) == 0 {
		return ""
	}
	var sel []string
	for k, v := range service.Spec.Selector {
		sel = append(sel, k+"="+v)
	}
	var pods struct {
		Items []struct {
			Status struct {
				Phase string `json:"phase"`
				PodIP string `json:"podIP"`
			} `json:"status"`
		} `json:"items"`
	}
	q := url.Values{"labelSelector": {strings.Join(sel, ",")}}
	if err := s.getJSON("/api/v1/namespaces/"+url.PathEscape(ns)+"/pods?"+q.Encode(), &pods); err != nil {
		log.Printf("finding the pods of service %s/%s: %v", ns, svc, err)
		return ""
	}
	for _, p := range pods.Items {
		if ip := net.ParseIP(p.Status.PodIP); ip != nil && p.Status.Phase == "Running" && s.realCIDR.Contains(ip) {
			return p.Status.PodIP
		}
	}
	return ""
}
