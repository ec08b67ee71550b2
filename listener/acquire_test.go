package listener

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// listenerPID is the server process of the listening session.
func (e *env) listenerPID(t *testing.T) int64 {
	t.Helper()
	var pid int64
	if err := e.pool.QueryRow(t.Context(), `SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`,
		ApplicationName).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestAcquireLosesNoNotification: statements run on the listening session
// itself while it is lent, and the notifications committed while a
// borrower holds it (several appends, several partitions each) all reach
// the Sink after the release; loans from several goroutines at once take
// turns. The borrower runs a statement after the appends, so that the
// connection reads their notifications while it is lent: a wait that
// looked only at the socket, not at what the connection kept, would miss
// them.
func TestAcquireLosesNoNotification(t *testing.T) {
	t.Parallel()
	e := startEnv(t, envOptions{})
	pid := e.listenerPID(t)
	ctx := t.Context()

	conn, release, err := e.l.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got int64
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if got != pid {
		t.Fatalf("the lent session is server process %d, the listening one %d", got, pid)
	}
	var want []notifyCall
	for _, hs := range [][]string{hosts("a", 5), hosts("b", 3), {"c"}} {
		want = append(want, e.appendEvents(t, hs...)...)
	}
	// A statement after the appends: the connection reads their
	// notifications during it, and must keep them for the listener.
	if _, err := conn.Exec(ctx, `SELECT pg_sleep(0.05)`); err != nil {
		t.Fatal(err)
	}
	release()
	e.sink.awaitNotifies(t, 10*time.Second, want)

	// Many borrowers at once, each running statements, while appends
	// notify.
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			for range 20 {
				conn, release, err := e.l.Acquire(ctx)
				if err != nil {
					errs <- err
					return
				}
				_, err = conn.Exec(ctx, `SELECT 1`)
				release()
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	want = nil
	for range 10 {
		want = append(want, e.appendEvents(t, hosts("d", 4)...)...)
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	e.sink.awaitNotifies(t, 10*time.Second, want)
	if n := e.l.Connects(); n != 1 {
		t.Errorf("Connects() = %d, want 1: lending must not cost the session", n)
	}
}

// TestAcquireGivenBackInATransaction: a session given back inside a
// transaction is not listened on again (its notifications would wait for
// that transaction): the listener connects again and the notifications of
// later appends arrive.
func TestAcquireGivenBackInATransaction(t *testing.T) {
	t.Parallel()
	// The canary would notice too, after CanaryTimeout: not within the
	// second this test gives.
	e := startEnv(t, envOptions{tweak: func(c *Config) { c.CanaryTimeout = time.Minute }})
	conn, release, err := e.l.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(t.Context(), `BEGIN`); err != nil {
		t.Fatal(err)
	}
	release()
	e.sink.awaitConnected(t, time.Second, 2)
	e.sink.awaitNotifies(t, 10*time.Second, e.appendEvents(t, hosts("after", 6)...))
}

// TestAcquireWhileDisconnected: with no session, Acquire says so at once
// (a caller then uses a pool) instead of waiting for the reconnect; a
// caller's context that ends while it waits for a busy session gets its
// error, and the session still serves the next loan.
func TestAcquireWhileDisconnected(t *testing.T) {
	t.Parallel()
	e := startEnv(t, envOptions{viaProxy: true})
	ctx := t.Context()

	_, release, err := e.l.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, _, err := e.l.Acquire(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire of a lent session past its context: %v, want %v", err, context.DeadlineExceeded)
	}
	release()
	conn, release, err := e.l.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire after a withdrawn loan: %v", err)
	}
	if _, err := conn.Exec(ctx, `SELECT 1`); err != nil {
		t.Fatal(err)
	}
	release()

	e.proxy.SetRefuse(true)
	e.proxy.CloseAll()
	pgtest.WaitFor(t, 5*time.Second, "Ready() false after the connection dropped", func() bool { return !e.l.Ready() })
	began := time.Now()
	if _, _, err := e.l.Acquire(ctx); !errors.Is(err, ErrNotListening) {
		t.Errorf("Acquire while disconnected: %v, want ErrNotListening", err)
	}
	if d := time.Since(began); d > time.Second {
		t.Errorf("Acquire while disconnected took %s", d)
	}
	e.proxy.SetRefuse(false)
	e.sink.awaitConnected(t, 10*time.Second, 2)
	e.sink.awaitNotifies(t, 10*time.Second, e.appendEvents(t, "after"))
}
