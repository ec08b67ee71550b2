package listener

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// recSink is a Sink that records its calls and signals every change on
// changed, so that tests wait for calls without sleeping.
type recSink struct {
	mu        sync.Mutex
	notifies  []notifyCall
	connected int
	changed   chan struct{} // capacity 1: "something changed since you last looked"
}

func newRecSink() *recSink { return &recSink{changed: make(chan struct{}, 1)} }

func (s *recSink) Notify(topic, partition int, maxOffset int64) {
	s.mu.Lock()
	s.notifies = append(s.notifies, notifyCall{topic, partition, maxOffset})
	s.mu.Unlock()
	s.signal()
}

func (s *recSink) Connected() {
	s.mu.Lock()
	s.connected++
	s.mu.Unlock()
	s.signal()
}

func (s *recSink) signal() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// snapshot returns a copy of the recorded calls.
func (s *recSink) snapshot() (notifies []notifyCall, connected int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.notifies), s.connected
}

// await waits until cond holds on the recorded calls, failing the test with
// msg if that takes longer than timeout.
func (s *recSink) await(t *testing.T, timeout time.Duration, msg string, cond func(notifies []notifyCall, connected int) bool) {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		if cond(s.snapshot()) {
			return
		}
		select {
		case <-s.changed:
		case <-timer.C:
			n, c := s.snapshot()
			t.Fatalf("timed out after %s waiting for: %s (Connected calls: %d, Notify calls: %v)", timeout, msg, c, n)
		}
	}
}

// awaitConnected waits until Connected has been called n times in all.
func (s *recSink) awaitConnected(t *testing.T, timeout time.Duration, n int) {
	t.Helper()
	s.await(t, timeout, fmt.Sprintf("Connected called %d times", n), func(_ []notifyCall, c int) bool { return c >= n })
}

// awaitNotifies waits until every call of want has been recorded.
func (s *recSink) awaitNotifies(t *testing.T, timeout time.Duration, want []notifyCall) {
	t.Helper()
	s.await(t, timeout, fmt.Sprintf("Notify calls %v", want), func(got []notifyCall, _ int) bool {
		for _, w := range want {
			if !slices.Contains(got, w) {
				return false
			}
		}
		return true
	})
}

// env is a listener running against a migrated database with topic 1 (4
// partitions).
type env struct {
	pool  *pgxpool.Pool // direct connections to the test database
	sink  *recSink
	l     *Listener
	proxy *pgtest.Proxy // between the listener and the server, when asked for
}

type envOptions struct {
	viaProxy bool
	tweak    func(*Config)
}

func startEnv(t *testing.T, opts envOptions) *env {
	t.Helper()
	dbURL := pgtest.MigratedDB(t)
	pool := pgtest.Pool(t, dbURL)
	// Every append notifies: these tests are about the listener, not about
	// which appends notify.
	if _, err := pool.Exec(t.Context(), "INSERT INTO log_counter (topic_id, total_partitions, wake) VALUES (1, 4, 'always')"); err != nil {
		t.Fatal(err)
	}
	e := &env{pool: pool, sink: newRecSink()}

	listenURL := dbURL
	if opts.viaProxy {
		u, err := url.Parse(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		if u.Hostname() == "" {
			t.Fatalf("cannot proxy %s: no TCP host", u.Redacted())
		}
		port := u.Port()
		if port == "" {
			port = "5432"
		}
		e.proxy = pgtest.StartProxy(t, net.JoinHostPort(u.Hostname(), port))
		u.Host = e.proxy.Addr()
		listenURL = u.String()
	}
	cc, err := pgx.ParseConfig(listenURL)
	if err != nil {
		t.Fatal(err)
	}
	logger := zerolog.New(io.MultiWriter(logtest.New(t), zerolog.NewTestWriter(t)))
	cfg := Config{
		ConnConfig: cc,
		Notify: func(ctx context.Context, channel, payload string) error {
			_, err := pool.Exec(ctx, "SELECT pg_notify($1, $2)", channel, payload)
			return err
		},
		Logger: &logger,
		Sink:   e.sink,
	}
	if opts.tweak != nil {
		opts.tweak(&cfg)
	}
	e.l, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.l.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return within 10s of cancel")
		}
	})
	e.sink.awaitConnected(t, 10*time.Second, 1)
	if !e.l.Ready() {
		t.Fatal("Ready() = false after Connected")
	}
	return e
}

// appendEvents appends one event for each host in one statement to topic 1,
// and returns the Notify calls its notification must cause, read back from
// the table.
func (e *env) appendEvents(t *testing.T, hosts ...string) []notifyCall {
	t.Helper()
	events := make([]map[string]string, len(hosts))
	for i, h := range hosts {
		events[i] = map[string]string{"host_id": h, "event_type": "test.event"}
	}
	js, err := json.Marshal(events)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := e.pool.Query(t.Context(), "SELECT append_events(1, $1)", js)
	if err != nil {
		t.Fatal(err)
	}
	offsets, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	rows, err = e.pool.Query(t.Context(), `
		SELECT 1, partition_id, max(c_offset) FROM outbox_message_t
		 WHERE topic_id = 1 AND c_offset = ANY($1)
		 GROUP BY partition_id ORDER BY partition_id`, offsets)
	if err != nil {
		t.Fatal(err)
	}
	want, err := pgx.CollectRows(rows, pgx.RowToStructByPos[notifyCall])
	if err != nil {
		t.Fatal(err)
	}
	if len(want) == 0 {
		t.Fatal("append_events wrote nothing")
	}
	return want
}

// hosts returns n host ids with the given prefix.
func hosts(prefix string, n int) []string {
	hs := make([]string, n)
	for i := range hs {
		hs[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return hs
}

// terminateListener ends the listening connection's backend.
func (e *env) terminateListener(t *testing.T) {
	t.Helper()
	var n int
	err := e.pool.QueryRow(t.Context(), `
		SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		 WHERE application_name = $1 AND datname = current_database()`, ApplicationName).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("terminated %d backends named %q, want 1", n, ApplicationName)
	}
}

func TestNotificationReachesSink(t *testing.T) {
	t.Parallel()
	e := startEnv(t, envOptions{})

	want := e.appendEvents(t, hosts("host", 16)...)
	if len(want) < 2 {
		t.Fatalf("16 hosts fell in %d partition(s); the test wants several", len(want))
	}
	e.sink.awaitNotifies(t, 10*time.Second, want)

	got, connected := e.sink.snapshot()
	if !slices.Equal(got, want) {
		t.Errorf("Notify calls = %v, want exactly %v", got, want)
	}
	if connected != 1 {
		t.Errorf("Connected called %d times, want 1", connected)
	}
	if n := e.l.Connects(); n != 1 {
		t.Errorf("Connects() = %d, want 1", n)
	}
}

func TestReconnectAfterTerminate(t *testing.T) {
	t.Parallel()
	e := startEnv(t, envOptions{})
	e.sink.awaitNotifies(t, 10*time.Second, e.appendEvents(t, "before"))

	e.terminateListener(t)
	e.sink.awaitConnected(t, time.Second, 2)

	e.sink.awaitNotifies(t, 10*time.Second, e.appendEvents(t, hosts("after", 8)...))
	if n := e.l.Connects(); n != 2 {
		t.Errorf("Connects() = %d, want 2", n)
	}
	if !e.l.Ready() {
		t.Error("Ready() = false after reconnect")
	}
}

// TestCanaryDetectsSilentConnection freezes the listening connection: no
// byte crosses it any more, yet neither end sees it close and TCP keepalive
// is answered, as with a silent network. Only the canary can notice: a
// notification sent through another connection (Config.Notify) that does
// not come back, or, as a consumer runs it, a ping of the session itself
// that goes unanswered (with no ping sent, that case fails: no second
// Connected).
func TestCanaryDetectsSilentConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ping bool
	}{{"notification through another connection", false}, {"ping of the session", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := startEnv(t, envOptions{viaProxy: true, tweak: func(c *Config) {
				c.CanaryInterval = 200 * time.Millisecond
				c.CanaryTimeout = time.Second
				if tc.ping {
					c.Notify = nil
				}
			}})
			e.sink.awaitNotifies(t, 10*time.Second, e.appendEvents(t, "before"))

			if n := e.proxy.Freeze(); n != 1 {
				t.Fatalf("froze %d connections, want the listener's 1", n)
			}

			// CanaryTimeout plus a tick, then a reconnect through the proxy.
			e.sink.awaitConnected(t, 5*time.Second, 2)
			if n := e.l.Connects(); n != 2 {
				t.Errorf("Connects() = %d, want 2", n)
			}
			e.sink.awaitNotifies(t, 10*time.Second, e.appendEvents(t, hosts("after", 8)...))
			if !e.l.Ready() {
				t.Error("Ready() = false after reconnect")
			}
		})
	}
}

func TestReadyWhileDisconnected(t *testing.T) {
	t.Parallel()
	e := startEnv(t, envOptions{viaProxy: true})

	e.proxy.SetRefuse(true)
	e.proxy.CloseAll()
	pgtest.WaitFor(t, 5*time.Second, "Ready() false after the connection dropped", func() bool { return !e.l.Ready() })
	// The listener keeps dialling and stays down while it cannot connect.
	// (One of the refused connections may be pgx's cancel request.)
	pgtest.WaitFor(t, 10*time.Second, "4 refused connections", func() bool { return e.proxy.Refused() >= 4 })
	if e.l.Ready() {
		t.Error("Ready() = true while every connection attempt fails")
	}
	if n := e.l.Connects(); n != 1 {
		t.Errorf("Connects() = %d while disconnected, want 1", n)
	}

	e.proxy.SetRefuse(false)
	e.sink.awaitConnected(t, 10*time.Second, 2)
	pgtest.WaitFor(t, time.Second, "Ready() true after reconnect", e.l.Ready)
	if n := e.l.Connects(); n != 2 {
		t.Errorf("Connects() = %d, want 2", n)
	}
	e.sink.awaitNotifies(t, 10*time.Second, e.appendEvents(t, "after"))
}

// TestMalformedPayloadKeepsWatchdog: anyone may NOTIFY the event channel.
// A payload Decode rejects must not be taken for a lost connection: Ready()
// stays true and the canary keeps watching, so a silent connection is still
// detected afterwards.
func TestMalformedPayloadKeepsWatchdog(t *testing.T) {
	t.Parallel()
	e := startEnv(t, envOptions{viaProxy: true, tweak: func(c *Config) {
		c.CanaryInterval = 200 * time.Millisecond
		c.CanaryTimeout = time.Second
	}})
	if _, err := e.pool.Exec(t.Context(), "SELECT pg_notify('event_channel', 'garbage')"); err != nil {
		t.Fatal(err)
	}
	// Notifications are handled in order: once this one has arrived, the
	// malformed one has been handled and its error logged.
	e.sink.awaitNotifies(t, 10*time.Second, append(e.appendEvents(t, "after-garbage"), notifyCall{0, -1, 0}))
	if !e.l.Ready() {
		t.Error("Ready() = false on a live connection after a malformed payload")
	}

	if n := e.proxy.Freeze(); n != 1 {
		t.Fatalf("froze %d connections, want 1", n)
	}
	e.sink.awaitConnected(t, 5*time.Second, 2)
}

// TestForeignPayloadsWakeQuietly: a trigger of another design on the same
// channel (a seed-style notify_event() sending 'new_event', as during a
// cutover with the adopt bridge) notifies with every transaction of its
// producers. Each such notification wakes every partition, and is logged
// once, not once per transaction as a warning.
func TestForeignPayloadsWakeQuietly(t *testing.T) {
	t.Parallel()
	logs := logtest.New(t)
	e := startEnv(t, envOptions{tweak: func(c *Config) {
		l := zerolog.New(logs).Level(zerolog.InfoLevel)
		c.Logger = &l
	}})
	const n = 40
	for range n {
		if _, err := e.pool.Exec(t.Context(), "SELECT pg_notify('event_channel', 'new_event')"); err != nil {
			t.Fatal(err)
		}
	}
	// Notifications arrive in order: once the append's has, so have the
	// foreign ones.
	own := e.appendEvents(t, "after-foreign")
	e.sink.await(t, 10*time.Second, "the foreign notifications and the append's", func(got []notifyCall, _ int) bool {
		return len(got) >= n+len(own)
	})
	got, _ := e.sink.snapshot()
	for i, c := range got[:n] {
		if c != (notifyCall{0, -1, 0}) {
			t.Fatalf("notification %d woke %v, want every partition of every topic", i, c)
		}
	}
	if f := e.l.Foreign(); f != n {
		t.Errorf("Foreign() = %d, want %d", f, n)
	}
	out := logs.String()
	if w := strings.Count(out, `"level":"warn"`); w != 0 {
		t.Errorf("%d warnings for foreign notifications, want none:\n%s", w, out)
	}
	if i := strings.Count(out, "not pgevents' own"); i != 1 {
		t.Errorf("foreign notifications logged %d times at info level, want once:\n%s", i, out)
	}
}
