// A Go net/http server and client (standard library only) for tests/gohttp.rs:
// programs nobody on the project wrote, on both sides of sluice.
//
//	gohttp serve [--tls CERT KEY]     prints "port N", serves until killed
//	gohttp call URL CASE [--ca FILE]  runs one case, prints one JSON line
package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"os"
	"strings"
	"time"
)

func handler(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/trailers":
		body, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(body)
		w.Header().Set("Trailer", "X-Sum, X-Got")
		w.Header().Set("Content-Type", "text/plain")
		// The body was read whole: its trailers are here, and can go in the head too.
		w.Header().Set("X-Got-In-Head", r.Trailer.Get("X-Client-Trailer"))
		io.WriteString(w, strings.Repeat("a body with trailers after it\n", 200))
		w.Header().Set("X-Sum", hex.EncodeToString(sum[:]))
		w.Header().Set("X-Got", r.Trailer.Get("X-Client-Trailer"))
		// Not announced in Trailer: still a trailer.
		w.Header().Set(http.TrailerPrefix+"X-Proto", r.Proto)
	case "/early":
		// 103 Early Hints (Go 1.19+ sends any 1xx), then the answer a moment later.
		w.Header().Set("Link", "</style.css>; rel=preload; as=style")
		w.WriteHeader(http.StatusEarlyHints)
		time.Sleep(100 * time.Millisecond)
		w.Header().Del("Link")
		io.WriteString(w, "final")
	case "/continue":
		// Go's server sends 100 Continue when the handler first reads the body.
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d bytes, expect=%q", len(body), r.Header.Get("Expect"))
	default:
		http.NotFound(w, r)
	}
}

func serve(args []string) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Printf("port %d\n", ln.Addr().(*net.TCPAddr).Port)
	srv := &http.Server{Handler: http.HandlerFunc(handler)}
	if len(args) == 3 && args[0] == "--tls" {
		err = srv.ServeTLS(ln, args[1], args[2])
	} else {
		err = srv.Serve(ln)
	}
	panic(err)
}

func client(args []string) *http.Client {
	tr := &http.Transport{ExpectContinueTimeout: 5 * time.Second, ForceAttemptHTTP2: true}
	if len(args) == 2 && args[0] == "--ca" {
		pem, err := os.ReadFile(args[1])
		if err != nil {
			panic(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, ServerName: "app.test"}
	}
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func call(url, kind string, c *http.Client) map[string]any {
	out := map[string]any{"interim": []string{}}
	var req *http.Request
	upload := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	switch kind {
	case "trailers":
		// A body of unknown length (chunked on HTTP/1.1) with a trailer after it.
		req, _ = http.NewRequest("POST", url+"/trailers", io.MultiReader(bytes.NewReader(upload)))
		req.Trailer = http.Header{"X-Client-Trailer": {"sent-by-go"}}
		// Go's HTTP/1.1 client does not say it takes trailers; its HTTP/2 one may.
		req.Header.Set("TE", "trailers")
		sum := sha256.Sum256(upload)
		out["sent_sum"] = hex.EncodeToString(sum[:])
	case "continue":
		req, _ = http.NewRequest("POST", url+"/continue", bytes.NewReader(upload))
		req.Header.Set("Expect", "100-continue")
	case "early":
		req, _ = http.NewRequest("GET", url+"/early", nil)
		var interim []string
		trace := &httptrace.ClientTrace{
			Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
				interim = append(interim, fmt.Sprintf("%d %s", code, h.Get("Link")))
				out["interim"] = interim
				return nil
			},
		}
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	default:
		panic("unknown case " + kind)
	}
	resp, err := c.Do(req)
	if err != nil {
		out["error"] = err.Error()
		return out
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	out["status"] = resp.StatusCode
	out["proto"] = resp.Proto
	out["uncompressed"] = resp.Uncompressed
	out["body_len"] = len(body)
	out["got_in_head"] = resp.Header.Get("X-Got-In-Head")
	if kind == "continue" || kind == "early" {
		out["body"] = string(body)
	}
	tr := map[string]string{}
	for k := range resp.Trailer {
		tr[k] = resp.Trailer.Get(k)
	}
	out["trailers"] = tr
	return out
}

func main() {
	switch os.Args[1] {
	case "serve":
		serve(os.Args[2:])
	case "call":
		out := call(os.Args[2], os.Args[3], client(os.Args[4:]))
		json.NewEncoder(os.Stdout).Encode(out)
	}
}
