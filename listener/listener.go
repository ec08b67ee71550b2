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
	// listening one, for the canary (a pool's Exec does). nil: the canary
	// is a ping of the listening session itself (sendCanary), which
	// notifies nobody.
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
	// restart ends the current listening connection's run with the cause
	// errChannelChanged, so that Run listens again on the channel
	// SetChannel set; guarded by mu.
	restart context.CancelCauseFunc
	lastRx  atomic.Int64
	connect atomic.Int64 // successful connects, including the first
	ready   atomic.Bool
	foreign atomic.Int64 // notifications that were not pgevents' own
	// retry paces the connects while they fail and logs the connection's
	// failures, once per backoff.DefaultInterval while they repeat.
	retry *backoff.Retry

	// The loans of the session (Acquire): guarded by lmu. serving is true
	// while a session listens and can be lent; interrupt ends the current
	// wait for a notification, so that the queued loans are served.
	lmu       sync.Mutex
	serving   bool
	queue     []*loan
	interrupt context.CancelFunc

	// Used by listen's goroutine only.
	lastConnect time.Time
	quickDeaths int
}

// loan is one Acquire: the session is sent on granted (closed when the
// session was lost first), and the borrower closes done to give it back.
type loan struct {
	granted chan *pgx.Conn
	done    chan struct{}
	once    sync.Once
}

func (ln *loan) release() { ln.once.Do(func() { close(ln.done) }) }

// How long a borrower may keep the session: loanMax, after which the
// listener closes it (longer than a statement's DefaultStatementTimeout
// of a consumer pool, 30 s), and lendGrace, how long a stopping listener
// waits for it to be given back before it closes it.
const (
	loanMax   = time.Minute
	lendGrace = 5 * time.Second
)

// ErrNotListening is returned by Acquire while the listener has no session.
var ErrNotListening = errors.New("listener: no listening session")

// errChannelChanged is the cause with which SetChannel ends a listening
// session: the only end of a session, apart from Run's context, that is not
// a loss. listen tells it apart by this cause, never by the context's state,
// since every end of a session cancels its context.
var errChannelChanged = errors.New("listener: the topic's channel changed")

// msgLost is the warning of a lost listening session (and its key in the
// Retry's lines: logged once per backoff.DefaultInterval while it repeats).
const msgLost = "listener: listening session lost, reconnecting"

// New validates cfg, applies defaults and returns a Listener.
func New(cfg Config) (*Listener, error) {
	if cfg.ConnConfig == nil || cfg.Sink == nil {
		return nil, errors.New("listener: ConnConfig and Sink are required")
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
		l.restart(errChannelChanged)
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

// listen listens on the current channel until ctx is cancelled, and again
// on the new channel whenever SetChannel changes it, connecting again
// after the session is lost. A channel change (the cause errChannelChanged
// of the session's context) connects again at once and is logged at info
// level; any other end of the session is a loss: logged as a warning (once
// per interval while it repeats, with the count of repeats) and backed off
// (dial), the more when sessions die right after being made.
func (l *Listener) listen(ctx context.Context) error {
	for {
		l.mu.Lock()
		channel := l.channel
		lctx, cancel := context.WithCancelCause(ctx)
		l.restart = cancel
		l.mu.Unlock()
		conn, err := l.dial(lctx)
		if err == nil {
			err = l.serve(lctx, conn, channel)
			l.stopLending()
			l.setConn(nil)
			cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = conn.Close(cctx)
			ccancel()
		}
		// The cause is kept by the first cancel: SetChannel's, when it
		// ended the session, and nil (context.Canceled) otherwise.
		cancel(nil)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(context.Cause(lctx), errChannelChanged):
			l.lastConnect = time.Time{} // not a quick death: connect at once
			l.cfg.Logger.Info().Str("from", channel).Str("to", l.Channel()).Msg("listener: listening on the topic's new channel")
		default:
			if err == nil {
				err = errors.New("the session ended")
			}
			l.logError(ctx, err)
		}
	}
}

// serve LISTENs on conn, then waits for notifications until the session
// fails or ctx is cancelled, lending the session (Acquire) between two
// waits.
func (l *Listener) serve(ctx context.Context, conn *pgx.Conn, channel string) error {
	for _, ch := range []string{channel, l.canary} {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize()); err != nil {
			return fmt.Errorf("listen %s: %w", ch, err)
		}
	}
	l.lastRx.Store(time.Now().UnixNano())
	l.connect.Add(1)
	l.ready.Store(true)
	l.retry.Ok()
	l.lmu.Lock()
	l.serving = true
	l.lmu.Unlock()
	// After LISTEN: events committed while nobody listened are looked for.
	l.cfg.Sink.Connected()
	for {
		if err := l.lend(ctx, conn); err != nil {
			return err
		}
		wctx, cancel := context.WithCancel(ctx)
		l.lmu.Lock()
		if len(l.queue) > 0 {
			l.lmu.Unlock()
			cancel()
			continue
		}
		l.interrupt = cancel
		l.lmu.Unlock()
		n, err := conn.WaitForNotification(wctx)
		l.lmu.Lock()
		l.interrupt = nil
		l.lmu.Unlock()
		cancel()
		if err != nil {
			if ctx.Err() == nil && wctx.Err() != nil && !conn.IsClosed() {
				continue // interrupted to lend the session
			}
			return err
		}
		switch n.Channel {
		case l.canary:
			l.lastRx.Store(time.Now().UnixNano())
		case channel:
			l.handleNotification(n)
		}
	}
}

// Acquire lends the listening session to the caller until it calls
// release, which it must, once, after its last use of the connection (its
// rows read or closed, its transaction ended). Meanwhile the listener
// reads no notification: they are kept by the connection and read after
// the release, so none is lost, but each waits for it; borrow the session
// for short statements only, never for one that may wait for a lock. It
// returns ErrNotListening while the listener has no session (it is
// connecting), and ctx's error if ctx ends before the session is free. A
// connection left in a transaction, or broken, is closed at its release
// and the listener connects again.
func (l *Listener) Acquire(ctx context.Context) (conn *pgx.Conn, release func(), err error) {
	ln := &loan{granted: make(chan *pgx.Conn, 1), done: make(chan struct{})}
	l.lmu.Lock()
	if !l.serving {
		l.lmu.Unlock()
		return nil, nil, ErrNotListening
	}
	l.queue = append(l.queue, ln)
	if l.interrupt != nil {
		l.interrupt()
	}
	l.lmu.Unlock()
	select {
	case c, ok := <-ln.granted:
		if !ok {
			return nil, nil, ErrNotListening
		}
		return c, ln.release, nil
	case <-ctx.Done():
		l.lmu.Lock()
		queued := false
		for i, q := range l.queue {
			if q == ln {
				l.queue = append(l.queue[:i], l.queue[i+1:]...)
				queued = true
				break
			}
		}
		l.lmu.Unlock()
		if !queued {
			// Being granted (or failed): take it and give it back.
			if _, ok := <-ln.granted; ok {
				ln.release()
			}
		}
		return nil, nil, ctx.Err()
	}
}

// lend serves the queued loans one after the other, each until its
// release.
func (l *Listener) lend(ctx context.Context, conn *pgx.Conn) error {
	for {
		l.lmu.Lock()
		if len(l.queue) == 0 {
			l.lmu.Unlock()
			return nil
		}
		ln := l.queue[0]
		l.queue = l.queue[1:]
		l.lmu.Unlock()
		ln.granted <- conn
		kept := time.NewTimer(loanMax)
		select {
		case <-ln.done:
			kept.Stop()
		case <-kept.C:
			// A borrower that never gives the session back (a bug: rows
			// never closed, say) would stop the wake-ups for good.
			l.cfg.Logger.Error().Int64("kept_ms", loanMax.Milliseconds()).Msg("listener: the session was not given back; closing it and connecting again")
			_ = conn.PgConn().Conn().Close()
			select {
			case <-ln.done:
			case <-time.After(lendGrace):
			}
			return fmt.Errorf("the session was not given back within %s", loanMax)
		case <-ctx.Done():
			kept.Stop()
			// Stopping: the borrower, stopped by the same context, gives
			// the session back before it is closed; one that does not
			// within lendGrace finds it closed under it.
			select {
			case <-ln.done:
			case <-time.After(lendGrace):
			}
			return ctx.Err()
		}
		if conn.IsClosed() {
			return errors.New("the session was lost while lent")
		}
		if st := conn.PgConn().TxStatus(); st != 'I' {
			return fmt.Errorf("the session was given back in a transaction (status %c)", st)
		}
	}
}

// stopLending refuses new loans and fails the queued ones: the session is
// gone.
func (l *Listener) stopLending() {
	l.lmu.Lock()
	defer l.lmu.Unlock()
	l.serving = false
	for _, ln := range l.queue {
		close(ln.granted)
	}
	l.queue = nil
}

// dial connects, backing off after the connection was lost and while
// dialling fails (from 50 ms to 5 s, with jitter), and more when
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

// handleNotification takes a notification of the event channel. A
// payload it cannot decode (anyone may NOTIFY the channel) wakes every
// partition; it is not a connection error. One that is not pgevents' own
// at all (ErrForeignPayload: the 'new_event' of a seed-style notify_event()
// trigger on the same channel, say, as during a cutover with the adopt
// bridge) is logged once, at info level, then at debug level only, since it
// comes with every transaction of the other trigger's producers; a
// malformed payload of pgevents' form is logged as a warning.
func (l *Listener) handleNotification(n *pgconn.Notification) {
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
	l.retry.Fail(err, msgLost)
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
		err := l.sendCanary(sctx)
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

// sendCanary notifies the canary channel through Config.Notify. Without
// it, the canary is a ping of the listening session itself: an answer
// proves what a canary's return proves, that the session is up with its
// LISTEN in place (both end only with the session), and it notifies
// nobody. A notification would cost every listening session of the
// database a transaction (PostgreSQL signals them all, whatever the
// channel), so N processes' canaries would cost N² of them every
// CanaryInterval. A ping the session does not answer within ctx closes
// the connection (pgconn does, for a round trip cut short), and the
// listener connects again at the release.
func (l *Listener) sendCanary(ctx context.Context) error {
	if l.cfg.Notify != nil {
		return l.cfg.Notify(ctx, l.canary, "")
	}
	conn, release, err := l.Acquire(ctx)
	if err != nil {
		return err // not connected, or busy past the interval: try again
	}
	defer release()
	if err := conn.Ping(ctx); err != nil {
		return err
	}
	l.lastRx.Store(time.Now().UnixNano())
	return nil
}

// kill closes the listening connection's socket, which makes the pending
// wait for a notification fail and the listener connect again.
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
