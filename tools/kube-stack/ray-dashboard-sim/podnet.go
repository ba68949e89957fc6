// The simulated pod network. The API server sends its traffic to nodes and pods (the "cluster" egress) here as
// HTTP CONNECT tunnels (scripts/with-kube gives it an EgressSelectorConfiguration naming this server):
//
//   - a tunnel to an address in the pods' range (--pod-cidr, kwok's --cidr) reaches the simulated pod: an HTTP
//     server that answers any path with a metrics page in the Prometheus text format naming the pod, its port
//     and how many times it was scraped, so the API server's pod proxy (/api/v1/namespaces/NS/pods/NAME:PORT/
//     proxy/PATH) works as it does on a real cluster;
//   - a tunnel to anything else (kwok's kubelet server, for logs) is plain TCP to that address on loopback.
//
// Nothing beyond loopback is ever dialled.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"sync"
)

type podNet struct {
	cidr *net.IPNet
	s    *server
	mu   sync.Mutex
	// Scrapes per pod address and port.
	scrapes map[string]int
}

func (p *podNet) connect(w http.ResponseWriter, r *http.Request) {
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		http.Error(w, "bad CONNECT target", http.StatusBadRequest)
		return
	}
	ip := net.ParseIP(host)
	toPod := ip != nil && p.cidr != nil && p.cidr.Contains(ip)
	if !toPod && (ip == nil || !ip.IsLoopback()) {
		http.Error(w, "only pods and loopback are reachable here", http.StatusForbidden)
		return
	}
	var upstream net.Conn
	if !toPod {
		upstream, err = net.Dial("tcp", r.Host)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "no hijacking", http.StatusInternalServerError)
		return
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		return
	}
	if _, err := conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		conn.Close()
		return
	}
	if !toPod {
		go func() {
			// What the client sent after its CONNECT may already sit in the hijacked reader.
			_, _ = io.Copy(upstream, rw.Reader)
			upstream.Close()
		}()
		_, _ = io.Copy(conn, upstream)
		conn.Close()
		return
	}
	p.servePod(conn, rw.Reader, host, port)
}

// servePod answers HTTP requests on one tunnel to a pod until the client closes it.
func (p *podNet) servePod(conn net.Conn, br *bufio.Reader, ip, port string) {
	defer conn.Close()
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		req.Body.Close()
		name := p.podName(ip)
		p.mu.Lock()
		p.scrapes[ip+":"+port]++
		n := p.scrapes[ip+":"+port]
		p.mu.Unlock()
		body := fmt.Sprintf("# HELP sim_pod_up The simulated pod answered.\n# TYPE sim_pod_up gauge\n"+
			"sim_pod_up{pod=%q,port=%q,path=%q} 1\n# TYPE sim_scrapes_total counter\nsim_scrapes_total{pod=%q} %d\n",
			name, port, req.URL.Path, name, n)
		resp := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %d\r\n\r\n%s",
			len(body), body)
		if _, err := conn.Write([]byte(resp)); err != nil {
			return
		}
		log.Printf("pod %s (%s:%s) scraped at %s", name, ip, port, req.URL.Path)
	}
}

// podName finds the pod that has this address, through the API server.
func (p *podNet) podName(ip string) string {
	s := p.s
	if s.api == "" {
		return ""
	}
	req, _ := http.NewRequest(http.MethodGet,
		s.api+"/api/v1/pods?fieldSelector="+url.QueryEscape("status.podIP="+ip), nil)
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := s.client.Do(req)
	if err != nil {
		log.Printf("finding the pod of %s: %v", ip, err)
		return ""
	}
	defer resp.Body.Close()
	var list struct {
		Items []struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Items) == 0 {
		return ""
	}
	return list.Items[0].Metadata.Name
}
