package httpserve

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// serve runs h on a loopback listener with Run, and returns the server's
// URL, the cancel that ends Run's context, and Run's result.
func serve(t *testing.T, h http.Handler, shutdownTimeout time.Duration) (string, context.CancelFunc, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	done := make(chan error, 1)
	go func() { done <- Run(ctx, &http.Server{Handler: h}, ln, shutdownTimeout) }()
	return "http://" + ln.Addr().String() + "/", cancel, done
}

// TestRunWaitsForRequestsInFlight: when the context ends, a request in
// flight still gets its whole answer, Run returns nil only after it, and
// the address accepts no new connection.
func TestRunWaitsForRequestsInFlight(t *testing.T) {
	t.Parallel()
	started, finish := make(chan struct{}), make(chan struct{})
	url, cancel, done := serve(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		close(started)
		<-finish
		_, _ = io.WriteString(w, "whole answer")
	}), time.Minute)
	body := make(chan string, 1)
	go func() {
		resp, err := http.Get(url)
		if err != nil {
			body <- "error: " + err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body <- string(b)
	}()
	<-started
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned %v while a request was in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(finish)
	if got := <-body; got != "whole answer" {
		t.Errorf("the request in flight at shutdown got %q, want its whole answer", got)
	}
	if err := <-done; err != nil {
		t.Errorf("Run after a graceful shutdown: %v, want nil", err)
	}
	if _, err := http.Get(url); err == nil {
		t.Error("the server still answers after Run returned")
	}
}

// TestRunClosesWhatOutlivesTheTimeout: a request that outlives the
// shutdown bound is cut off, and Run returns nil within about the bound.
func TestRunClosesWhatOutlivesTheTimeout(t *testing.T) {
	t.Parallel()
	started, never := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(never) })
	url, cancel, done := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-never
	}), 200*time.Millisecond)
	failed := make(chan error, 1)
	go func() {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
		}
		failed <- err
	}()
	<-started
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return 10 s after a shutdown bounded by 200 ms")
	}
	select {
	case err := <-failed:
		if err == nil {
			t.Error("the request that outlived the shutdown bound got an answer, want its connection closed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request that outlived the shutdown bound is still open 10 s after Run returned")
	}
}

// TestRunReportsServeErrors: a listener that fails is Serve's error, not
// nil.
func TestRunReportsServeErrors(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	err = Run(context.Background(), &http.Server{}, ln, time.Second)
	if err == nil || errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Run on a closed listener: %v, want the listener's error", err)
	}
}
