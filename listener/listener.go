package listener

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgxlisten"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents/internal/backoff"
	"github.com/pgevents/pgevents/internal/netconn"
)

// Sink receives the wake-ups. Its methods are called from the listener's
// goroutine and must not block: signal a worker and return.
type Sink interface {
	// Notify says that partition of topic has events up to maxOffset.
	// partition is -1 and maxOffset 0 when the notification named every
	// partition of the topic.
	Notify(topic, partition int, maxOffset int64)
	// Connected is called after each successful (re)connect, once LISTEN is
	// in place: events committed while nobody listened must be looked for.
	Connected()
}

// ApplicationName is the application_name of the listening connection.
const ApplicationName = "pgevents-listener"

// Config configures a Listener.
type Config struct {
	// ConnConfig is the configuration the listening connection is dialled
	// with; required. It is copied, and its DialFunc replaced by netconn.Dial.
	ConnConfig *pgx.ConnConfig
	// Channel is the notification channel the topic's appends notify;
	// default "event_channel". SetChannel changes it while the listener
	// runs.
	Channel string
	// CanaryInterval is how often a canary notification is sent; default 1 s.
	CanaryInterval time.Duration
	// CanaryTimeout is how long the listener may go without receiving its
	// canary, while sending it succeeds, before it reconnects; default 3 s.
	CanaryTimeout time.Duration
	// Notify sends a notification through a connection other than the
	// listening one, for the canary; required (a pool's Exec does).
	Notify func(ctx context.Context, channel, payload string) error
	// Logger receives connection errors; default: discard.
	Logger *zerolog.Logger
	// Sink receives the wake-ups; required.
	Sink Sink
}

// Listener owns the listening connection. Create it with New and run it
// with Run.
type Listener struct {
	cfg    Config
	canary string

	mu      sync.Mutex
	conn    *pgx.Conn // current listening connection, nil while disconnected
	channel string    // the channel listened on; guarded by mu
	// restart ends the current listening connection's run, so that Run
	// listens again on the channel SetChannel set; guarded by mu.
	restart context.CancelFunc
	lastRx  atomic.Int64
	connect atomic.Int64 // successful connects, including the first
	ready   atomic.Bool
	foreign atomic.Int64 // notifications that were not pgevents' own
	// retry paces the connects while they fail and logs the connection's
	// failures, once per backoff.DefaultInterval while they repeat.
	retry *backoff.Retry

	// Used by dial only, which pgxlisten calls from one goroutine.
	lastConnect time.Time
	quickDeaths int
}

// New validates cfg, applies defaults and returns a Listener.
func New(cfg Config) (*Listener, error) {
	if cfg.ConnConfig == nil || cfg.Sink == nil || cfg.Notify == nil {
		return nil, errors.New("listener: ConnConfig, Sink and Notify are required")
	}
	if cfg.Channel == "" {
		cfg.Channel = "event_channel"
	}
	if cfg.CanaryInterval <= 0 {
		cfg.CanaryInterval = time.Second
	}
	if cfg.CanaryTimeout <= 0 {
		cfg.CanaryTimeout = 3 * time.Second
	}
	if cfg.Logger == nil {
		nop := zerolog.Nop()
		cfg.Logger = &nop
	}
	cc := cfg.ConnConfig.Copy()
	cc.DialFunc = netconn.Dial
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	// Operators find (and tests kill) the listening connection by this name.
	cc.RuntimeParams["application_name"] = ApplicationName
	cfg.ConnConfig = cc
	var nonce [6]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return nil, fmt.Errorf("listener: nonce: %w", err)
	}
	return &Listener{cfg: cfg, channel: cfg.Channel, canary: "pgevents_canary_" + hex.EncodeToString(nonce[:]),
		retry: backoff.New(*cfg.Logger, "listener")}, nil
}

// Channel returns the channel the listener listens on.
func (l *Listener) Channel() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.channel
}

// SetChannel makes the listener listen on channel instead: it drops the
// listening connection and connects again, LISTENing on channel, after
// which Sink.Connected is called as after any reconnect, so that events
// committed meanwhile are looked for. It never blocks.
func (l *Listener) SetChannel(channel string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if channel == l.channel {
		return
	}
	l.channel = channel
	if l.restart != nil {
		l.restart()
	}
}

// Ready reports whether the listening connection is up with LISTEN in place.
func (l *Listener) Ready() bool { return l.ready.Load() }

// Connects returns the number of successful connects so far; more than one
// means the listener has reconnected.
func (l *Listener) Connects() int64 { return l.connect.Load() }

// Run listens until ctx is cancelled, reconnecting as needed, and returns
// nil then.
func (l *Listener) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return l.listen(gctx) })
	g.Go(func() error { return l.watch(gctx) })
	return g.Wait()
}

// listen runs pgxlisten on the current channel until ctx is cancelled, and
// again on the new channel whenever SetChannel changes it.
func (l *Listener) listen(ctx context.Context) error {
	for {
		l.mu.Lock()
		channel := l.channel
		lctx, cancel := context.WithCancel(ctx)
		l.restart = cancel
		l.mu.Unlock()
		pl := &pgxlisten.Listener{
			Connect:        l.dial,
			LogError:       l.logError,
			ReconnectDelay: -1, // no fixed delay: dial backs off while failing
		}
		pl.Handle(channel, l)
		pl.Handle(l.canary, pgxlisten.HandlerFunc(func(context.Context, *pgconn.Notification, *pgx.Conn) error {
			l.lastRx.Store(time.Now().UnixNano())
			return nil
		}))
		err := pl.Listen(lctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case lctx.Err() != nil:
			l.setConn(nil)
			l.lastConnect = time.Time{} // not a quick death: connect at once
			l.cfg.Logger.Info().Str("from", channel).Str("to", l.Channel()).Msg("listener: listening on the topic's new channel")
		default:
			return err
		}
	}
}

// dial is pgxlisten's Connect: it backs off after the connection was lost
// and while dialling fails (from 50 ms to 5 s, with jitter), and more when
// connections die right after being made (a server that accepts and then
// refuses LISTEN, say), so that neither becomes a tight loop.
func (l *Listener) dial(ctx context.Context) (*pgx.Conn, error) {
	l.setConn(nil)
	wait := l.retry.Backoff()
	if !l.lastConnect.IsZero() && time.Since(l.lastConnect) < time.Second {
		l.quickDeaths++
		wait = max(wait, backoff.Delay(2*backoff.DefaultMin, backoff.DefaultMax, l.quickDeaths))
	} else {
		l.quickDeaths = 0
	}
	for {
		if wait > 0 && !backoff.Sleep(ctx, wait) {
			return nil, ctx.Err()
		}
		conn, err := pgx.ConnectConfig(ctx, l.cfg.ConnConfig)
		if err == nil {
			l.lastConnect = time.Now()
			l.setConn(conn)
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		wait = l.retry.Fail(err, "listener: connect failed")
	}
}

func (l *Listener) setConn(c *pgx.Conn) {
	l.mu.Lock()
	l.conn = c
	l.mu.Unlock()
	if c == nil {
		l.ready.Store(false)
	}
}

// HandleBacklog implements pgxlisten.BacklogHandler: pgxlisten calls it once
// LISTEN is in place on a new connection, which is when events committed
// while disconnected must be looked for.
func (l *Listener) HandleBacklog(ctx context.Context, channel string, conn *pgx.Conn) error {
	l.lastRx.Store(time.Now().UnixNano())
	l.connect.Add(1)
	l.ready.Store(true)
	l.retry.Ok()
	l.cfg.Sink.Connected()
	return nil
}

// HandleNotification implements pgxlisten.Handler for the event channel. A
// payload it cannot decode (anyone may NOTIFY the channel) wakes every
// partition; it is not a connection error. One that is not pgevents' own
// at all (ErrForeignPayload: the 'new_event' of a seed-style notify_event()
// trigger on the same channel, say, as during a cutover with the adopt
// bridge) is logged once, at info level, then at debug level only, since it
// comes with every transaction of the other trigger's producers; a
// malformed payload of pgevents' form is logged as a warning.
func (l *Listener) HandleNotification(ctx context.Context, n *pgconn.Notification, conn *pgx.Conn) error {
	l.lastRx.Store(time.Now().UnixNano())
	err := Decode(n.Payload, l.cfg.Sink.Notify)
	switch {
	case err == nil:
	case errors.Is(err, ErrForeignPayload):
		if l.foreign.Add(1) == 1 {
			l.cfg.Logger.Info().Str("channel", n.Channel).Str("payload", shortPayload(n.Payload)).
				Msg("listener: notifications that are not pgevents' own arrive on the channel (another trigger notifies it); each wakes every partition (logged once)")
		} else {
			l.cfg.Logger.Debug().Str("payload", shortPayload(n.Payload)).Msg("listener: foreign notification, waking every partition")
		}
	default:
		l.cfg.Logger.Warn().Err(err).Msg("listener: undecodable notification, waking every partition")
	}
	return nil
}

// Foreign returns the number of notifications received that were not
// pgevents' own (ErrForeignPayload).
func (l *Listener) Foreign() int64 { return l.foreign.Load() }

func shortPayload(p string) string {
	if len(p) > 64 {
		return p[:64] + "..."
	}
	return p
}

func (l *Listener) logError(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	l.ready.Store(false)
	l.retry.Fail(err, "listener: connection lost, reconnecting")
}

// watch sends the canary and closes the listening connection when the
// canary stops coming back while sending it works.
func (l *Listener) watch(ctx context.Context) error {
	t := time.NewTicker(l.cfg.CanaryInterval)
	defer t.Stop()
	var lastSent time.Time // last successful send while connected
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if !l.ready.Load() {
			lastSent = time.Time{}
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, l.cfg.CanaryInterval)
		err := l.cfg.Notify(sctx, l.canary, "")
		cancel()
		if err != nil {
			continue // the database itself is unreachable: nothing to learn
		}
		now := time.Now()
		if lastSent.IsZero() {
			lastSent = now
		}
		rx := time.Unix(0, l.lastRx.Load())
		if now.Sub(rx) > l.cfg.CanaryTimeout && now.Sub(lastSent) > l.cfg.CanaryTimeout {
			l.retry.Fail(fmt.Errorf("no canary for %s", now.Sub(rx).Round(time.Millisecond)), "listener: canary not received, reconnecting")
			l.kill()
			lastSent = time.Time{}
		}
	}
}

// kill closes the listening connection's socket, which makes the pending
// wait for a notification fail and pgxlisten reconnect.
func (l *Listener) kill() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		_ = l.conn.PgConn().Conn().Close()
	}
	l.ready.Store(false)
}

// ErrForeignPayload is wrapped by Decode's error for a payload that is not
// pgevents' at all: it does not start with a topic number and a colon.
var ErrForeignPayload = errors.New("not a notification of pgevents")

// Decode parses a payload of the append trigger, "<topic>:<partition>/<max
// offset>,..." or "<topic>:*", and calls fn for each partition it names (with
// partition -1 for "*"). A payload it cannot parse wakes too much rather than
// too little, since a lost wake-up costs a poll period: every partition of
// the topic (partition -1) when the topic can be read, of every topic (topic
// 0) otherwise; and it returns an error, which wraps ErrForeignPayload when
// the payload is not of pgevents' form at all.
func Decode(payload string, fn func(topic, partition int, maxOffset int64)) error {
	ts, rest, ok := strings.Cut(payload, ":")
	topic, err := strconv.Atoi(ts)
	if !ok || err != nil {
		fn(0, -1, 0)
		if !ok || !digits(ts) {
			return fmt.Errorf("listener: bad payload %q: %w", payload, ErrForeignPayload)
		}
		return fmt.Errorf("listener: bad payload %q", payload)
	}
	if rest == "*" {
		fn(topic, -1, 0)
		return nil
	}
	if rest == "" {
		fn(topic, -1, 0)
		return fmt.Errorf("listener: bad payload %q: no partition named", payload)
	}
	for rest != "" {
		var item string
		item, rest, _ = strings.Cut(rest, ",")
		ps, os, ok := strings.Cut(item, "/")
		p, err1 := strconv.Atoi(ps)
		off, err2 := strconv.ParseInt(os, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			fn(topic, -1, 0)
			return fmt.Errorf("listener: bad payload %q", payload)
		}
		fn(topic, p, off)
	}
	return nil
}

// digits reports whether s is a non-empty run of ASCII digits.
func digits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
