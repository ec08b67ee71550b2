package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/pgevents/pgevents/internal/httpserve"
	"github.com/pgevents/pgevents/schema"
)

// Defaults of ServerConfig.
const (
	// DefaultReadyTimeout bounds /readyz's SELECT 1.
	DefaultReadyTimeout = time.Second
	// DefaultShutdownTimeout bounds the graceful shutdown of the server.
	DefaultShutdownTimeout = 5 * time.Second
)

// ServerConfig configures a Server.
type ServerConfig struct {
	// Addr is the address to listen on, "host:port" or ":port"; required.
	// Port 0 picks a free port (see Server.Addr).
	Addr string
	// Metrics is the handler of /metrics, typically Metrics.Handler();
	// nil serves no /metrics.
	Metrics http.Handler
	// DB is the database /readyz checks with SELECT 1; required.
	DB schema.DB
	// MoreDBs are the other databases of a process whose consumers run on
	// several (one pool each): /readyz checks each as it checks DB, and
	// answers 200 only when every one answers.
	MoreDBs []schema.DB
	// Ready reports whether the consumer's listener is connected
	// (Consumer.Ready); /readyz also requires it. nil: not checked.
	Ready func() bool
	// ReadyTimeout bounds /readyz's SELECT 1; default DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// Pprof serves Go's profiles under /debug/pprof/.
	Pprof bool
	// ShutdownTimeout bounds the wait for requests in flight when Run's
	// context ends, after which their connections are closed; default
	// DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
}

// Server serves /metrics, /healthz, /readyz and, when enabled,
// /debug/pprof/. NewServer listens; Run serves until its context ends.
type Server struct {
	cfg ServerConfig
	ln  net.Listener
	srv *http.Server
}

// NewServer validates cfg and listens on cfg.Addr, so that an address in
// use fails here, before anything else starts. Call Run to serve, or Close
// to release the address without serving.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Addr == "" {
		return nil, errors.New("metrics: server Addr is required")
	}
	if cfg.DB == nil {
		return nil, errors.New("metrics: server DB is required")
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen: %w", err)
	}
	s := &Server{cfg: cfg, ln: ln}
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	return s, nil
}

// Addr returns the address the server listens on, with the port chosen
// when the configured one was 0.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Handler returns the server's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	if s.cfg.Metrics != nil {
		mux.Handle("GET /metrics", s.cfg.Metrics)
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", s.readyz)
	if s.cfg.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// readyz answers 200 when every database answers SELECT 1 within
// ReadyTimeout and the listener is connected, 503 otherwise; the body
// names each check and its result.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	var problems []string
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.ReadyTimeout)
	defer cancel()
	for i, db := range append([]schema.DB{s.cfg.DB}, s.cfg.MoreDBs...) {
		name := "database"
		if len(s.cfg.MoreDBs) > 0 {
			name = fmt.Sprintf("database %d of %d", i+1, len(s.cfg.MoreDBs)+1)
		}
		var one int
		if err := db.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			problems = append(problems, name+": "+err.Error())
		}
	}
	if s.cfg.Ready != nil && !s.cfg.Ready() {
		problems = append(problems, "listener: not connected")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if len(problems) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, strings.Join(problems, "\n"))
		return
	}
	fmt.Fprintln(w, "ok")
}

// Run serves until ctx ends, then shuts down gracefully: it stops
// accepting, waits up to ShutdownTimeout for requests in flight, closes
// what remains, and returns nil. It returns an error when serving fails.
// Call it once.
func (s *Server) Run(ctx context.Context) error {
	if err := httpserve.Run(ctx, s.srv, s.ln, s.cfg.ShutdownTimeout); err != nil {
		return fmt.Errorf("metrics: serve: %w", err)
	}
	return nil
}

// Close releases the address of a server whose Run was never called.
func (s *Server) Close() error { return s.ln.Close() }
