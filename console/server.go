package console

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/pgevents/pgevents/internal/httpserve"
)

// ShutdownTimeout bounds the wait for requests in flight (a replay, say)
// when a Server's Run context ends; their connections are closed after.
const ShutdownTimeout = 10 * time.Second

// Server serves a Console over HTTP: Listen listens, Run serves until its
// context ends. For TLS, mount the Console in a server of your own, or put
// a proxy in front (and set Options.SecureCookie).
type Server struct {
	ln  net.Listener
	srv *http.Server
}

// Listen listens on addr ("host:port" or ":port"; port 0 picks one, see
// Addr) for the console h, so that an address in use fails before anything
// else starts. Call Run to serve, or Close to release the address.
func Listen(addr string, h http.Handler) (*Server, error) {
	if h == nil {
		return nil, errors.New("console: a handler is required")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("console: listen: %w", err)
	}
	return &Server{ln: ln, srv: &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
	}}, nil
}

// Addr returns the address the server listens on, with the port chosen.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// URL returns the console's address as a URL a browser opens.
func (s *Server) URL() string {
	host, port, err := net.SplitHostPort(s.Addr())
	if err != nil {
		return "http://" + s.Addr() + "/"
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	return "http://" + net.JoinHostPort(host, port) + "/"
}

// Run serves until ctx ends, then shuts down: it stops accepting, waits up
// to ShutdownTimeout for the requests in flight, closes what remains and
// returns nil. It returns an error when serving fails. Call it once.
func (s *Server) Run(ctx context.Context) error {
	if err := httpserve.Run(ctx, s.srv, s.ln, ShutdownTimeout); err != nil {
		return fmt.Errorf("console: serve: %w", err)
	}
	return nil
}

// Close releases the address of a server whose Run was never called.
func (s *Server) Close() error { return s.ln.Close() }
