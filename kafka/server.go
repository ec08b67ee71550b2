package kafka

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kmsg"
	"golang.org/x/sync/errgroup"
)

// Defaults of Options.
const (
	// DefaultListen is the address Options.Listen defaults to.
	DefaultListen = ":9092"
	// DefaultMaxRequestBytes is Options.MaxRequestBytes' default: a request
	// frame larger than this closes the connection before its body is
	// read (Kafka's socket.request.max.bytes is 100 MiB).
	DefaultMaxRequestBytes = 16 << 20
	// DefaultMaxWait is Options.MaxWait's default: the longest a Fetch
	// waits for events, whatever the client asks.
	DefaultMaxWait = 30 * time.Second
	// DefaultRequestTimeout is Options.RequestTimeout's default: how long a
	// request may take in the database before the connection is closed.
	DefaultRequestTimeout = 60 * time.Second
	// DefaultSessionTimeout bounds the session timeout a group member may
	// ask for (Kafka's group.max.session.timeout.ms is 30 minutes).
	DefaultSessionTimeout = 5 * time.Minute
	// idleTimeout is how long a connection may stay without a request
	// (Kafka's connections.max.idle.ms).
	idleTimeout = 10 * time.Minute
)

// Options configure a Server. Only Topics is required.
type Options struct {
	// Listen is the TCP address the server listens on. Default
	// DefaultListen.
	Listen string
	// AdvertisedAddr is the host:port clients are told to connect to (in
	// Metadata and FindCoordinator). Default: the listener's address, with
	// the host "localhost" when it listens on every interface.
	AdvertisedAddr string
	// Topics maps each Kafka topic name the server exposes to the
	// pgevents topic id behind it. A name must be a valid Kafka topic name
	// (ValidTopicName).
	Topics map[string]int
	// ReadOnly refuses Produce and InitProducerId (TOPIC_AUTHORIZATION_FAILED
	// and CLUSTER_AUTHORIZATION_FAILED): clients can only read and commit.
	ReadOnly bool
	// Users, when set, requires SASL/PLAIN authentication: user name to
	// password. Without TLS, the password travels in clear.
	Users map[string]string
	// TLS, when set, serves TLS on the listener.
	TLS *tls.Config
	// NodeID is the broker id the server reports; gateways that serve the
	// same database need distinct ids. Default 0.
	NodeID int32
	// MaxRequestBytes bounds a request frame. Default DefaultMaxRequestBytes.
	MaxRequestBytes int32
	// MaxWait bounds how long a Fetch waits. Default DefaultMaxWait.
	MaxWait time.Duration
	// RequestTimeout bounds a request's database work. Default
	// DefaultRequestTimeout.
	RequestTimeout time.Duration
	// Logger receives the server's lines; nil logs nothing.
	Logger *zerolog.Logger
}

// Server speaks the Kafka protocol over a pgevents database. Create it
// with New and run it with Run.
type Server struct {
	pool   *pgxpool.Pool
	opts   Options
	log    zerolog.Logger
	topics map[string]*topic // by Kafka name
	ids    map[int]*topic    // by pgevents id
	groups *coordinator
	leases *leases
	waits  *waiters
	// refusals logs what the endpoint refuses, a line per client and
	// kind per interval.
	refusals refusals

	mu   sync.Mutex
	addr net.Addr // the listener's, once Run listens
	ln   net.Listener
	host string
	port int32
}

// ErrInvalidOptions is wrapped by New's errors about Options.
var ErrInvalidOptions = errors.New("kafka: invalid options")

// New validates opts and returns a Server on pool. The pool should come
// from pgevents.ParsePoolConfig (the consumer's session settings).
func New(pool *pgxpool.Pool, opts Options) (*Server, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: a pool is required", ErrInvalidOptions)
	}
	if opts.Listen == "" {
		opts.Listen = DefaultListen
	}
	if opts.MaxRequestBytes <= 0 {
		opts.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if opts.MaxWait <= 0 {
		opts.MaxWait = DefaultMaxWait
	}
	if opts.RequestTimeout <= 0 {
		opts.RequestTimeout = DefaultRequestTimeout
	}
	if len(opts.Topics) == 0 {
		return nil, fmt.Errorf("%w: Topics: at least one topic is required", ErrInvalidOptions)
	}
	s := &Server{pool: pool, opts: opts, topics: map[string]*topic{}, ids: map[int]*topic{}, log: zerolog.Nop()}
	if opts.Logger != nil {
		s.log = *opts.Logger
	}
	for name, id := range opts.Topics {
		if err := ValidTopicName(name); err != nil {
			return nil, fmt.Errorf("%w: Topics: %w", ErrInvalidOptions, err)
		}
		if id <= 0 {
			return nil, fmt.Errorf("%w: Topics: %q: topic id %d is not positive", ErrInvalidOptions, name, id)
		}
		if other := s.ids[id]; other != nil {
			return nil, fmt.Errorf("%w: Topics: %q and %q both name topic %d", ErrInvalidOptions, other.name, name, id)
		}
		t := &topic{name: name, id: id}
		s.topics[name], s.ids[id] = t, t
	}
	if opts.AdvertisedAddr != "" {
		if _, _, err := splitHostPort(opts.AdvertisedAddr); err != nil {
			return nil, fmt.Errorf("%w: AdvertisedAddr: %w", ErrInvalidOptions, err)
		}
	}
	s.groups = newCoordinator(s)
	s.leases = newLeases(s)
	s.waits = newWaiters(s)
	return s, nil
}

// ValidTopicName reports whether name is a valid Kafka topic name: 1 to 249
// characters of [a-zA-Z0-9._-], neither "." nor "..".
func ValidTopicName(name string) error {
	if name == "" || len(name) > 249 || name == "." || name == ".." {
		return fmt.Errorf("%q is not a valid Kafka topic name (1 to 249 characters, not . or ..)", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("%q is not a valid Kafka topic name (only letters, digits, '.', '_' and '-')", name)
		}
	}
	return nil
}

func splitHostPort(addr string) (string, int32, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("port %q: %w", port, err)
	}
	return host, int32(p), nil
}

// Addr returns the address the server listens on, nil before Run listens.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// Listen opens the listener now, so that Addr answers before Run (Run
// opens it when Listen was not called).
func (s *Server) Listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", s.opts.Listen)
	if err != nil {
		return fmt.Errorf("kafka: listen: %w", err)
	}
	if s.opts.TLS != nil {
		ln = tls.NewListener(ln, s.opts.TLS)
	}
	s.ln, s.addr = ln, ln.Addr()
	adv := s.opts.AdvertisedAddr
	if adv == "" {
		host, port, _ := net.SplitHostPort(ln.Addr().String())
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			host = "localhost"
		}
		adv = net.JoinHostPort(host, port)
	}
	s.host, s.port, _ = splitHostPort(adv)
	return nil
}

// Run serves until ctx ends; it closes the listener and every connection,
// and waits for their goroutines, before it returns.
func (s *Server) Run(ctx context.Context) error {
	if err := s.Listen(); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.waits.run(gctx) })
	g.Go(func() error { return s.groups.run(gctx) })
	g.Go(func() error { return s.leases.run(gctx) })
	conns := sync.WaitGroup{}
	g.Go(func() error {
		<-gctx.Done()
		return s.ln.Close()
	})
	g.Go(func() error {
		defer conns.Wait()
		for {
			c, err := s.ln.Accept()
			if err != nil {
				if gctx.Err() != nil {
					return nil
				}
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue
				}
				return fmt.Errorf("kafka: accept: %w", err)
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				s.serve(gctx, c)
			}()
		}
	})
	s.log.Info().Str("listen", s.addr.String()).Str("advertised", net.JoinHostPort(s.host, strconv.Itoa(int(s.port)))).
		Int("topics", len(s.topics)).Msg("kafka endpoint listening")
	err := g.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// conn is one client connection: its requests are answered one at a
// time, in order, as a Kafka broker does.
type conn struct {
	s      *Server
	c      net.Conn
	client string
	user   string // the SASL user; "" without SASL
	authed bool   // SASL done, or not required
	mech   bool   // a SaslHandshake chose PLAIN
}

// errClose is returned by a handler when the connection must be closed
// (malformed request, a protocol violation).
var errClose = errors.New("kafka: close the connection")

func (s *Server) serve(ctx context.Context, nc net.Conn) {
	cn := &conn{s: s, c: nc, authed: len(s.opts.Users) == 0}
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()
	size := make([]byte, 4)
	var out []byte
	for {
		// A connection idle for idleTimeout is closed, as Kafka closes one
		// after connections.max.idle.ms; a request's body must follow its
		// size within RequestTimeout.
		_ = nc.SetReadDeadline(time.Now().Add(idleTimeout))
		if _, err := io.ReadFull(nc, size); err != nil {
			return
		}
		n := int32(binary.BigEndian.Uint32(size))
		if n < 8 || n > s.opts.MaxRequestBytes {
			s.log.Warn().Str("client", nc.RemoteAddr().String()).Int32("size", n).Msg("kafka: request size out of bounds; closing the connection")
			return
		}
		_ = nc.SetReadDeadline(time.Now().Add(s.opts.RequestTimeout))
		body := make([]byte, n)
		if _, err := io.ReadFull(nc, body); err != nil {
			return
		}
		req, corr, client, err := parseRequest(body)
		if err != nil {
			s.log.Warn().Err(err).Str("client", nc.RemoteAddr().String()).Msg("kafka: malformed request; closing the connection")
			return
		}
		cn.client = client
		resp, err := cn.handle(ctx, req)
		if err != nil {
			if !errors.Is(err, errClose) && ctx.Err() == nil {
				s.log.Warn().Err(err).Str("client", nc.RemoteAddr().String()).Int16("api_key", req.Key()).Msg("kafka: request failed; closing the connection")
			}
			return
		}
		if resp == nil { // Produce with acks=0
			continue
		}
		out = appendResponse(slices.Grow(out[:0], responseSize(resp)), corr, resp)
		_ = nc.SetWriteDeadline(time.Now().Add(s.opts.RequestTimeout))
		if _, err := nc.Write(out); err != nil {
			return
		}
	}
}

// parseRequest decodes a request frame's header and body. It never
// panics: kmsg's readers check every length against what is left.
func parseRequest(body []byte) (req kmsg.Request, corr int32, client string, err error) {
	defer func() {
		if r := recover(); r != nil {
			req, err = nil, fmt.Errorf("kafka: request decoding panicked: %v", r)
		}
	}()
	rd := kbin.Reader{Src: body}
	key, version := rd.Int16(), rd.Int16()
	corr = rd.Int32()
	if id := rd.NullableString(); id != nil {
		client = *id
	}
	if !rd.Ok() {
		return nil, corr, client, fmt.Errorf("kafka: truncated request header")
	}
	req = kmsg.RequestForKey(key)
	if req == nil {
		return nil, corr, client, fmt.Errorf("kafka: unknown api key %d", key)
	}
	lo, hi, ok := supported(key)
	if key == apiVersionsKey {
		// ApiVersions of a version above ours is answered (with our
		// versions), not refused: that is how a client learns them.
		if version > hi {
			return &unsupportedAPIVersions{version: version}, corr, client, nil
		}
	} else if !ok || version < lo || version > hi {
		return nil, corr, client, fmt.Errorf("kafka: api key %d version %d is not supported", key, version)
	}
	req.SetVersion(version)
	if req.IsFlexible() {
		kmsg.SkipTags(&rd)
		if !rd.Ok() {
			return nil, corr, client, fmt.Errorf("kafka: truncated request header")
		}
	}
	if err := req.ReadFrom(rd.Src); err != nil {
		return nil, corr, client, fmt.Errorf("kafka: api key %d version %d: %w", key, version, err)
	}
	return req, corr, client, nil
}

// responseSize estimates the size of resp's frame: a fetch's record
// batches and a margin, so that its buffer grows once, not by doubling.
func responseSize(resp kmsg.Response) int {
	n := 4096
	if f, ok := resp.(*kmsg.FetchResponse); ok {
		for _, t := range f.Topics {
			for _, p := range t.Partitions {
				n += len(p.RecordBatches) + 64
			}
		}
	}
	return n
}

// appendResponse appends resp's frame: size, correlation id, the header's
// tags (flexible versions, except ApiVersions'), the body.
func appendResponse(dst []byte, corr int32, resp kmsg.Response) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst = kbin.AppendInt32(dst, corr)
	if resp.IsFlexible() && resp.Key() != apiVersionsKey {
		dst = append(dst, 0)
	}
	dst = resp.AppendTo(dst)
	binary.BigEndian.PutUint32(dst[start:], uint32(len(dst)-start-4))
	return dst
}
