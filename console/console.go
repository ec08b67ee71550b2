package console

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/schema"
)

// Defaults of Options.
const (
	// DefaultQueryTimeout bounds the statements behind one page.
	DefaultQueryTimeout = 10 * time.Second
	// DefaultRefresh is how often live figures refresh.
	DefaultRefresh = 2 * time.Second
	// DefaultSessionTTL is how long a browser session lasts after sign-in.
	DefaultSessionTTL = 12 * time.Hour
	// DefaultPageSize is how many rows a list shows.
	DefaultPageSize = 50
	// MinTokenLen is the shortest Options.Token accepted.
	MinTokenLen = 16
)

// maxFailures is how many wrong tokens a client address may give in a
// minute; then it waits for the minute's end.
const maxFailures = 5

// Resolver replays and discards a group's dead letters with the group's
// handlers; *pgevents.Consumer satisfies it (its methods run in one
// transaction that holds every partition lock of the group).
type Resolver interface {
	// ReplayDeadLetter runs the handlers again on dead letter id's unit
	// and the parked events it releases, and removes them; it returns the
	// number of events handled.
	ReplayDeadLetter(ctx context.Context, id int64) (int, error)
	// DiscardDeadLetter removes dead letter id without handling its unit,
	// and handles the parked events it releases.
	DiscardDeadLetter(ctx context.Context, id int64) (int, error)
}

// Options configures a Console. The zero value of each field is its
// default, except Token, which is required unless ReadOnly.
type Options struct {
	// Schema is the schema pgevents lives in ("": the first schema of the
	// search_path), as the consumers' Config.Schema.
	Schema string
	// Token is the credential for actions, compared in constant time; at
	// least MinTokenLen characters. There is no default: it is required
	// unless ReadOnly.
	Token string
	// ReadOnly serves the pages without actions and refuses every action
	// request (403).
	ReadOnly bool
	// Resolvers returns what replays and discards the dead letters of a
	// group on a topic, or nil when the console has no handlers for it
	// (its dead letters are then shown without those actions). nil: none.
	Resolvers func(group string, topic int) Resolver
	// Logger receives a line per action (and per refused action request or
	// failed sign-in); nil logs nothing.
	Logger *zerolog.Logger
	// SecureCookie marks the session cookie Secure whatever the request:
	// set it when a proxy terminates TLS in front of the console and does
	// not send X-Forwarded-Proto. A request that arrived over TLS, or says
	// it did in X-Forwarded-Proto, gets a Secure cookie anyway.
	SecureCookie bool
	// QueryTimeout bounds the statements behind one page; default
	// DefaultQueryTimeout.
	QueryTimeout time.Duration
	// Refresh is how often live figures refresh; default DefaultRefresh.
	Refresh time.Duration
	// SessionTTL is how long a browser session lasts; default
	// DefaultSessionTTL.
	SessionTTL time.Duration
	// PageSize is how many rows a list shows; default DefaultPageSize.
	PageSize int
	// PagesNeedToken puts every page behind the token, not only the
	// actions: a request without a live session or the bearer token gets
	// 401 (the sign-in page and the stylesheet and script excepted).
	// Default false: anyone who reaches the console reads its pages,
	// payloads and errors included. It needs the token, so not with
	// ReadOnly.
	PagesNeedToken bool
	// Addr is the address the console is served on, "host:port" or
	// ":port" as given to Listen. A request whose Host header names
	// another host gets 421, so that a page of another site, whose name
	// its owner made to resolve to the console's address (DNS rebinding),
	// reads nothing: its requests carry its own name. Hosts compare by
	// name, not port. An IP address passes when the console listens on it;
	// localhost, 127.0.0.1 and [::1] when it listens on a loopback address;
	// any IP address and localhost when it listens on every address
	// (":port", "0.0.0.0:port") or Addr is "" (the default, for a console
	// mounted in a server of your own). A name other than localhost passes
	// only when Addr or AllowedHosts gives it.
	Addr string
	// AllowedHosts are further names the Host header may give: the name
	// operators use, of the machine or of a proxy in front. A port, if
	// given, is not compared. nil: none.
	AllowedHosts []string
	// TrustedProxies are proxies in front of the console, each an IP
	// address or a CIDR ("10.0.0.0/8"). The client's address, which the
	// sign-in limiter counts failures of and the audit shows, is the
	// connecting peer's, unless the peer is one of them: then the
	// right-most address of X-Forwarded-For that is not one of them.
	// nil (the default): X-Forwarded-For is ignored, and behind a proxy
	// every client has the proxy's address (five wrong tokens through it
	// then lock every operator out for a minute).
	TrustedProxies []string
}

// Console serves the console's pages and actions: it is an http.Handler.
// Create it with New; it is safe for concurrent use.
type Console struct {
	pool     *pgxpool.Pool
	opts     Options
	log      zerolog.Logger
	mux      *http.ServeMux
	sessions *sessions
	signins  *limiter
	hosts    hostRule       // the Host headers served
	proxies  []netip.Prefix // Options.TrustedProxies
	pages    templates
	dbLabel  string // user@host:port/database, never the password
	password string // removed from anything shown
}

// New validates opts, applies their defaults and returns a Console that
// reads and acts on the database through pool. Make the pool with
// pgevents.NewPoolConfig (or ParsePoolConfig), as the consumers' pool:
// with JIT compilation on, the server may take a second compiling a page's
// statement, after its snapshot was taken, and then find every lease
// expired on its clock.
func New(pool *pgxpool.Pool, opts Options) (*Console, error) {
	if pool == nil {
		return nil, errors.New("console: pool is required")
	}
	if opts.Schema != "" {
		if err := schema.ValidName(opts.Schema); err != nil {
			return nil, fmt.Errorf("console: Schema: %w", err)
		}
	}
	switch {
	case opts.ReadOnly && opts.PagesNeedToken:
		return nil, errors.New("console: PagesNeedToken needs the token, which a ReadOnly console does not take: set one of them")
	case opts.ReadOnly:
		opts.Token = "" // never used: no action is served
	case opts.Token == "":
		return nil, errors.New("console: Token is required unless ReadOnly: there is no default")
	case len([]rune(opts.Token)) < MinTokenLen:
		return nil, fmt.Errorf("console: Token must be at least %d characters", MinTokenLen)
	}
	if opts.QueryTimeout < 0 || opts.Refresh < 0 || opts.SessionTTL < 0 || opts.PageSize < 0 {
		return nil, errors.New("console: QueryTimeout, Refresh, SessionTTL and PageSize must not be negative")
	}
	opts.QueryTimeout = cmp.Or(opts.QueryTimeout, DefaultQueryTimeout)
	opts.Refresh = cmp.Or(opts.Refresh, DefaultRefresh)
	opts.SessionTTL = cmp.Or(opts.SessionTTL, DefaultSessionTTL)
	opts.PageSize = cmp.Or(opts.PageSize, DefaultPageSize)
	hosts, err := newHostRule(opts.Addr, opts.AllowedHosts)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	proxies, err := parsePrefixes(opts.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("console: TrustedProxies: %w", err)
	}
	log := zerolog.Nop()
	if opts.Logger != nil {
		log = opts.Logger.With().Str("component", "console").Logger()
	}
	pages, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	cc := pool.Config().ConnConfig
	c := &Console{
		pool:     pool,
		opts:     opts,
		log:      log,
		sessions: newSessions(opts.SessionTTL),
		signins:  newLimiter(maxFailures, time.Minute),
		hosts:    hosts,
		proxies:  proxies,
		pages:    pages,
		dbLabel:  fmt.Sprintf("%s@%s:%d/%s", cc.User, cc.Host, cc.Port, cc.Database),
		password: cc.Password,
	}
	c.routes()
	return c, nil
}

// routes registers the pages, the assets and the actions.
func (c *Console) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", c.page(c.overview))
	m.HandleFunc("GET /topics/{topic}/groups/{group}", c.page(c.groupPage))
	m.HandleFunc("GET /topics/{topic}/events", c.page(c.eventsPage))
	m.HandleFunc("GET /topics/{topic}/partitions/{partition}/offsets/{offset}", c.page(c.eventPage))
	m.HandleFunc("GET /topics/{topic}/hosts", c.page(c.hostPage))
	m.HandleFunc("GET /dead-letters", c.page(c.deadLettersPage))
	m.HandleFunc("GET /dead-letters/{id}", c.page(c.deadLetterPage))
	m.HandleFunc("GET /replicas", c.page(c.replicasPage))
	m.HandleFunc("GET /audit", c.page(c.auditPage))
	m.HandleFunc("GET /signin", c.servePage(c.signinPage))
	m.HandleFunc("GET /assets/{name}", c.asset)
	if !c.opts.ReadOnly {
		m.HandleFunc("POST /signin", c.signin)
		m.HandleFunc("POST /signout", c.action(c.signout))
		m.HandleFunc("POST /topics/{topic}/groups/{group}/pause", c.action(c.pause))
		m.HandleFunc("POST /topics/{topic}/groups/{group}/resume", c.action(c.resume))
		m.HandleFunc("POST /topics/{topic}/groups/{group}/unhalt", c.action(c.unhalt))
		m.HandleFunc("POST /topics/{topic}/groups/{group}/reset", c.action(c.reset))
		m.HandleFunc("POST /dead-letters/replay", c.action(c.replay))
		m.HandleFunc("POST /dead-letters/discard", c.action(c.discard))
	}
	// Anything else that is not a GET: an action this console does not
	// serve (in read-only mode, every one).
	m.HandleFunc("POST /", c.refuseAction)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { c.fail(w, r, http.StatusNotFound, "no such page") })
	c.mux = m
}

// ServeHTTP serves the console, with the security headers of every answer.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin") // no-referrer would make browsers send Origin: null
	h.Set("Cache-Control", "no-store")
	if !c.hosts.allows(r.Host) {
		c.log.Warn().Str("host", r.Host).Str("path", r.URL.Path).Str("remote", c.clientAddr(r)).Msg("request for another host refused")
		h.Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusMisdirectedRequest)
		_, _ = fmt.Fprintf(w, "421 misdirected request: this console does not answer to the host name %q. "+
			"If operators reach it by that name, add the name to console.allowedHosts (Options.AllowedHosts); "+
			"otherwise the request comes from a page of another site whose name points to this address.\n", r.Host)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	c.mux.ServeHTTP(w, r)
}

// refuseAction answers an action request the console does not serve.
func (c *Console) refuseAction(w http.ResponseWriter, r *http.Request) {
	status, msg := http.StatusNotFound, "no such action"
	if c.opts.ReadOnly {
		status, msg = http.StatusForbidden, "this console is read-only: it takes no action"
	}
	c.log.Warn().Str("path", r.URL.Path).Str("remote", c.clientAddr(r)).Int("status", status).Msg("action refused")
	c.fail(w, r, status, msg)
}

// redact removes the database password from s, which is about to be shown.
func (c *Console) redact(s string) string {
	if c.password == "" {
		return s
	}
	return strings.ReplaceAll(s, c.password, "********")
}

// queryContext bounds the statements behind one page.
func (c *Console) queryContext(r *http.Request) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(r.Context(), c.opts.QueryTimeout)
	return schema.WithName(ctx, c.opts.Schema), cancel
}
