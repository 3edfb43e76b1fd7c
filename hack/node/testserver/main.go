// testserver is the one process of the real-node harness's test image: a static binary that
// serves HTTP, answers exec probes, calls the API server with its ServiceAccount token and exits
// at once on SIGTERM (a PID 1 that ignores SIGTERM makes every pod deletion take its full grace
// period).
//
//	testserver [serve]   listen on $PORT (default 8080)
//	testserver probe     exit 0 when the local server answers /healthz (an exec probe)
//	testserver get URL   print URL's body; exit 0 on a 2xx answer (a client inside a pod)
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

func main() {
	log.SetFlags(0)
	command := "serve"
	if len(os.Args) > 1 {
		command = os.Args[1]
	}
	switch command {
	case "serve":
		serve()
	case "probe":
		os.Exit(probe())
	case "get":
		if len(os.Args) != 3 {
			log.Fatal("usage: testserver get URL")
		}
		os.Exit(get(os.Args[2]))
	default:
		log.Fatalf("testserver: unknown command %q (serve, probe, get)", command)
	}
}

func port() string {
	if p := os.Getenv("PORT"); p != "" {
		return p
	}
	return "8080"
}

func serve() {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		host, _ := os.Hostname()
		log.Printf("testserver: %s %s from %s", r.Method, r.URL.Path, r.RemoteAddr)
		fmt.Fprintf(w, "hello from %s\n", host)
	})
	mux.HandleFunc("/apiserver", whoAmI)

	server := &http.Server{Addr: net.JoinHostPort("", port()), Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		sig := <-stop
		log.Printf("testserver: received %s, exiting", sig)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = server.Shutdown(ctx)
	}()
	log.Printf("testserver: listening on :%s", port())
	if err := server.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		log.Fatalf("testserver: %v", err)
	}
}

func probe() int {
	return get("http://127.0.0.1:" + port() + "/healthz")
}

func get(url string) int {
	client := http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer resp.Body.Close()
	_, _ = io.Copy(os.Stdout, resp.Body)
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		fmt.Fprintln(os.Stderr, resp.Status)
		return 1
	}
	return 0
}

// whoAmI asks the API server, through the `kubernetes` Service and with the pod's own token,
// who it is (a SelfSubjectReview, which every authenticated user may create), verifying the
// server against the ServiceAccount's CA. It relays the API server's status and body.
func whoAmI(w http.ResponseWriter, _ *http.Request) {
	token, err := os.ReadFile(serviceAccountDir + "/token")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	caPEM, err := os.ReadFile(serviceAccountDir + "/ca.crt")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	client := http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}},
	}
	host := net.JoinHostPort(os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"))
	body := `{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}`
	req, err := http.NewRequest(http.MethodPost, "https://"+host+"/apis/authentication.k8s.io/v1/selfsubjectreviews", bytes.NewBufferString(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}
