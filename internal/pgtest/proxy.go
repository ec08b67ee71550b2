package pgtest

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Proxy forwards TCP connections to a server, and breaks them on demand the
// ways networks do: Freeze stops forwarding without closing (a half-open
// connection), SetRefuse refuses new connections, CloseAll cuts them, and
// LoseAnswer lets a statement reach the server but never its answer reach
// the client (the server runs and commits it; the client sees its
// connection die), which is what a client's deadline passing while the
// answer is on its way looks like.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[*proxyConn]struct{}
	closed  bool
	refuse  bool
	refused int
	lose    []byte        // LoseAnswer's marker; nil: none armed
	lost    chan struct{} // closed when the statement's run went by
	wg      sync.WaitGroup
}

type proxyConn struct {
	p              *Proxy
	client, server net.Conn
	frozen         atomic.Bool
	mute           atomic.Bool // the server's answers are dropped
	pending        bool        // the next Execute mutes; guarded by p.mu
	done           chan struct{}
	once           sync.Once
}

// StartProxy starts a proxy to target (host:port), closed when the test
// ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// Addr returns the address clients connect to.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.refuse
		if refuse {
			p.refused++
		}
		p.mu.Unlock()
		if refuse {
			client.Close()
			continue
		}
		server, err := net.DialTimeout("tcp", p.target, 10*time.Second)
		if err != nil {
			client.Close()
			continue
		}
		c := &proxyConn{p: p, client: client, server: server, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			client.Close()
			server.Close()
			return
		}
		p.conns[c] = struct{}{}
		p.wg.Add(2)
		p.mu.Unlock()
		go c.pipe(server, client, true)
		go c.pipe(client, server, false)
	}
}

// pipe copies src to dst until either fails, or, once the connection is
// frozen, holds whatever it reads (data, end of file or error) until the
// connection is closed by the proxy. toServer says that src is the client.
func (c *proxyConn) pipe(dst, src net.Conn, toServer bool) {
	defer c.p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if c.frozen.Load() {
			<-c.done
			return
		}
		if n > 0 {
			if toServer {
				c.p.watch(c, buf[:n])
			}
			if !toServer && c.mute.Load() {
				continue // the answer is lost
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				c.close()
				return
			}
		}
		if err != nil {
			c.close()
			return
		}
	}
}

// execute is an Execute message of the unnamed portal with no row limit,
// as pgx sends it.
var execute = []byte{'E', 0, 0, 0, 9, 0, 0, 0, 0, 0}

// watch mutes c's answers once the client sends the armed marker and runs
// the statement it is in. pgx prepares a statement (Parse and Describe, with
// its text) and runs it (Bind and Execute) in two writes: the answers stop
// after the next write is forwarded. A statement prepared and run in one
// write stops them at once.
func (p *Proxy) watch(c *proxyConn, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c.pending {
		if bytes.Contains(b, execute) {
			c.mute.Store(true)
			c.pending = false
			close(p.lost)
		}
		return
	}
	if p.lose == nil {
		return
	}
	i := bytes.Index(b, p.lose)
	if i < 0 {
		return
	}
	p.lose = nil
	if bytes.Contains(b[i:], execute) {
		c.mute.Store(true)
		close(p.lost)
		return
	}
	c.pending = true
}

func (c *proxyConn) close() {
	c.once.Do(func() {
		close(c.done)
		c.client.Close()
		c.server.Close()
		c.p.mu.Lock()
		delete(c.p.conns, c)
		c.p.mu.Unlock()
	})
}

// LoseAnswer arms the proxy: the next statement whose text contains marker
// reaches the server, and from then on nothing the server sends on that
// connection reaches the client. The returned channel is closed when the
// statement's run went by; close the connection (CloseAll) once its effect
// is visible, and the client sees its connection die without an answer. A
// statement's text travels only when it is prepared, the first time a
// connection runs it (pgx's statement cache): use a fresh pool.
func (p *Proxy) LoseAnswer(marker string) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lose = []byte(marker)
	p.lost = make(chan struct{})
	return p.lost
}

// Freeze stops forwarding on every open connection, in both directions,
// without closing them, and returns how many it froze. New connections are
// forwarded normally.
func (p *Proxy) Freeze() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.frozen.Store(true)
	}
	return len(p.conns)
}

// CloseAll closes every open connection.
func (p *Proxy) CloseAll() {
	p.mu.Lock()
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
}

// SetRefuse makes the proxy close new connections as soon as it accepts
// them (refuse true), or forward them again.
func (p *Proxy) SetRefuse(refuse bool) {
	p.mu.Lock()
	p.refuse = refuse
	p.mu.Unlock()
}

// Refused returns how many connections the proxy has refused.
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Close stops the proxy and closes its connections.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.CloseAll()
	p.wg.Wait()
}

// ProxiedURL returns the URL of pool's database through a new Proxy, and
// the proxy, closed when the test ends.
func ProxiedURL(t testing.TB, pool *pgxpool.Pool) (string, *Proxy) {
	t.Helper()
	cc := pool.Config().ConnConfig
	if cc.Host == "" || cc.Host[0] == '/' {
		t.Fatalf("cannot proxy host %q: not TCP", cc.Host)
	}
	u, err := url.Parse(pool.Config().ConnString())
	if err != nil || u.Scheme == "" {
		t.Fatalf("cannot proxy %q: not a URL", redact(pool.Config().ConnString()))
	}
	p := StartProxy(t, net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port))))
	u.Host = p.Addr()
	return u.String(), p
}

// ProxiedPool returns a pool on pool's database whose connections go
// through a new Proxy, and the proxy; both are closed when the test ends.
func ProxiedPool(t testing.TB, pool *pgxpool.Pool) (*pgxpool.Pool, *Proxy) {
	t.Helper()
	u, p := ProxiedURL(t, pool)
	pc, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	// The same session settings as pool's (search_path in schema mode).
	for k, v := range pool.Config().ConnConfig.RuntimeParams {
		pc.ConnConfig.RuntimeParams[k] = v
	}
	out, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(out.Close)
	return out, p
}
