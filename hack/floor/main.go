// Command floor is a validating admission webhook that does nothing but answer: it decodes each
// admission.k8s.io/v1 AdmissionReview and allows the request under the request's uid.
//
// It is the floor bench/admission.py measures tally against: whatever a webhook costs the API
// server (serializing the object, the TLS round trip, decoding the answer) with no admission work
// on the webhook's side. Standard library only, so that the floor is Go's own HTTP and TLS and
// nothing else; built into the binary cache by hack/floor.py.
//
// With -client-ca, the server requires and verifies a client certificate signed by that CA
// (mutual TLS), as tally's webhook does with TALLY_WEBHOOK_CLIENT_CA: the handshake costs the same
// on both sides of the comparison.
//
// It offers HTTP/2 as Go's server does by default (the API server's webhook client takes it);
// -http1 offers HTTP/1.1 only, which is all tally's aiohttp server speaks, so that the protocol's
// share of the API server's cost can be measured.
//
// It prints "serving on https://<address>" on stdout once it accepts connections (listen on port
// 0 to be given a free one), "first review" on stdout before answering its first review (how a
// benchmark sees that the API server has picked up the webhook's registration), and on SIGINT or
// SIGTERM a count of the reviews it answered, by HTTP protocol, on stderr.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	reviewAPIVersion = "admission.k8s.io/v1"
	reviewKind       = "AdmissionReview"
	// The API server refuses request bodies above 3 MiB; an AdmissionReview holds one object
	// (two for an update) and some metadata.
	maxBody = 8 << 20
)

// admissionReview is the part of an AdmissionReview the floor reads. The reviewed objects are
// kept raw: decoding them into types would be admission work, which is what the floor leaves out.
type admissionReview struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Request    *admissionRequest `json:"request"`
}

type admissionRequest struct {
	UID       string          `json:"uid"`
	Operation string          `json:"operation"`
	Namespace string          `json:"namespace"`
	Name      string          `json:"name"`
	Object    json.RawMessage `json:"object"`
	OldObject json.RawMessage `json:"oldObject"`
}

type reviewResponse struct {
	APIVersion string            `json:"apiVersion"`
	Kind       string            `json:"kind"`
	Response   admissionResponse `json:"response"`
}

type admissionResponse struct {
	UID     string `json:"uid"`
	Allowed bool   `json:"allowed"`
}

type counters struct {
	http1, http2, bad atomic.Int64
	first             sync.Once
}

func (c *counters) serveReview(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "only POST", http.StatusMethodNotAllowed)
		c.bad.Add(1)
		return
	}
	var review admissionReview
	decoder := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	if err := decoder.Decode(&review); err != nil {
		http.Error(w, "not JSON: "+err.Error(), http.StatusBadRequest)
		c.bad.Add(1)
		return
	}
	if review.APIVersion != reviewAPIVersion || review.Kind != reviewKind ||
		review.Request == nil || review.Request.UID == "" {
		http.Error(w, "not an "+reviewAPIVersion+" "+reviewKind+" with a request uid",
			http.StatusBadRequest)
		c.bad.Add(1)
		return
	}
	body, err := json.Marshal(reviewResponse{
		APIVersion: reviewAPIVersion,
		Kind:       reviewKind,
		Response:   admissionResponse{UID: review.Request.UID, Allowed: true},
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	c.first.Do(func() { fmt.Println("first review") })
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
	if r.ProtoMajor == 2 {
		c.http2.Add(1)
	} else {
		c.http1.Add(1)
	}
}

func tlsConfig(clientCA string) (*tls.Config, error) {
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if clientCA == "" {
		return config, nil
	}
	pem, err := os.ReadFile(clientCA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", clientCA)
	}
	config.ClientCAs = pool
	config.ClientAuth = tls.RequireAndVerifyClientCert
	return config, nil
}

func run() error {
	listen := flag.String("listen", "127.0.0.1:8443", "address to serve on (port 0: a free one)")
	certFile := flag.String("cert", "", "serving certificate (PEM)")
	keyFile := flag.String("key", "", "its private key (PEM)")
	clientCA := flag.String("client-ca", "",
		"if set, require a client certificate signed by this CA (PEM): mutual TLS")
	http1 := flag.Bool("http1", false, "offer HTTP/1.1 only (default: HTTP/2 and HTTP/1.1)")
	flag.Parse()
	if *certFile == "" || *keyFile == "" {
		return errors.New("-cert and -key are required")
	}
	config, err := tlsConfig(*clientCA)
	if err != nil {
		return err
	}
	var count counters
	mux := http.NewServeMux()
	mux.HandleFunc("/", count.serveReview)
	server := &http.Server{Handler: mux, TLSConfig: config, ReadHeaderTimeout: 10 * time.Second}
	if *http1 {
		// Not through TLSConfig.NextProtos: ServeTLS adds "h2" to whatever it lists.
		server.Protocols = new(http.Protocols)
		server.Protocols.SetHTTP1(true)
	}
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- server.ServeTLS(listener, *certFile, *keyFile) }()
	fmt.Printf("serving on https://%s\n", listener.Addr())

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	select {
	case err := <-served:
		return err
	case <-signals:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = server.Shutdown(ctx)
	fmt.Fprintf(os.Stderr, "floor: %d reviews allowed (HTTP/1.1 %d, HTTP/2 %d), %d bad requests\n",
		count.http1.Load()+count.http2.Load(), count.http1.Load(), count.http2.Load(),
		count.bad.Load())
	return err
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}
