package consumercli

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// Liveness under the server's timeouts (issue 46): a handler's statement
// that the server cancels holds up its own unit, never its partition.

// stallBound is the longest a partition may go without a committed batch
// while it has events, in TestRoleTimeoutsSlowStatement. What it allows:
// a unit whose statement times out in 30 % of its runs runs alone after
// a backoff that doubles from retryInitialMs (100 ms) to retryMaxMs (1 s);
// 0.3^8 of such units fail eight times in a row, about 5 s of backoffs
// and attempts. On main before narrowing, a partition stalled for good.
const stallBound = 10 * time.Second

// roleTimeoutsConfig is a group of the recording SQL handler plus a type
// "slow" whose statement sleeps slowSQL, with the consumer's own session
// timeouts off, so that the role's apply.
func roleTimeoutsConfig(partitions int, slowSQL string, extra string) string {
	record := strings.Join(strings.Fields(eventtest.RecordSQL), " ")
	slow := `INSERT INTO handled (c_offset, host_id, partition_id, transaction_id) SELECT @c_offset, @host_id, @partition_id, @transaction_id FROM (SELECT ` + slowSQL + `) s`
	return fmt.Sprintf(`groupId: g
batchSize: 100
totalPartitions: %d
offsetScope: %s
waitPeriodMs: 1000
logLevel: warn
statementTimeoutMs: 0
idleInTransactionTimeoutMs: 0
handlerTimeoutMs: 500
retryInitialMs: 100
%s
handlers:
  - eventType: slow
    type: sql
    statement: %q
  - eventType: "*"
    type: sql
    statement: %q
`, partitions, pgtest.Scope(), extra, slow, record)
}

// setRoleTimeouts gives the role of url, in url's database only, the
// session settings of a managed database's role (ALTER ROLE ... IN
// DATABASE ... SET): new sessions of that role get them. It returns a
// function that resets them and closes pool's sessions, so that the
// test's checks run without them.
func setRoleTimeouts(t *testing.T, pool *pgxpool.Pool, rawURL string, settings map[string]string) (reset func()) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	db := strings.TrimPrefix(u.Path, "/")
	for k, v := range settings {
		eventtest.Exec(t, pool, fmt.Sprintf(`ALTER ROLE CURRENT_USER IN DATABASE %q SET %s = '%s'`, db, k, v))
	}
	done := false
	reset = func() {
		if done {
			return
		}
		done = true
		for k := range settings {
			_, _ = pool.Exec(context.Background(), fmt.Sprintf(`ALTER ROLE CURRENT_USER IN DATABASE %q RESET %s`, db, k))
		}
		pool.Reset()
	}
	t.Cleanup(reset)
	return reset
}

// produceMixed runs producers of multi-event transactions over several
// hosts until stop is closed: 1 to 6 events a transaction, share of them
// of type "slow". It returns the count of committed events once they
// stopped.
func produceMixed(t *testing.T, pool *pgxpool.Pool, seed uint64, producers int, slowShare float64, stop <-chan struct{}) func() int64 {
	var committed atomic.Int64
	var wg sync.WaitGroup
	ctx := context.Background()
	for i := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				evs := make([]pgevents.Event, 1+rng.IntN(6))
				for k := range evs {
					typ := "t"
					if rng.Float64() < slowShare {
						typ = "slow"
					}
					evs[k] = pgevents.Event{HostID: fmt.Sprintf("host-%d", rng.IntN(40)), UserID: fmt.Sprintf("u%d", rng.IntN(3)),
						EventType: typ, Payload: []byte(`{}`)}
				}
				tx, err := pool.Begin(ctx)
				if err == nil {
					// The producers are the trial's load, not its
					// subject: the role's short statement_timeout would
					// cut an append that waits for a partition's lock
					// (offset scope partition, a loaded run).
					_, err = tx.Exec(ctx, `SET LOCAL statement_timeout = 0`)
				}
				if err == nil {
					_, err = pgevents.Append(ctx, tx, evs...)
					if err == nil {
						err = tx.Commit(ctx)
					}
					_ = tx.Rollback(ctx)
				}
				if err != nil {
					t.Errorf("producer %d (seed %d): %v", i, seed, err)
					return
				}
				committed.Add(int64(len(evs)))
			}
		}()
	}
	return func() int64 {
		wg.Wait()
		return committed.Load()
	}
}

// TestRoleTimeoutsSlowStatement is the first trial of issue 46 with real
// processes: the consumers' role has statement_timeout 200 ms and
// idle_in_transaction_session_timeout 1 s, the consumer's own are off,
// handlerTimeoutMs is 500 and batchSize 100; 2 % of the events are of a
// type whose statement sleeps 0.3 s in 30 % of its runs, so the server
// cancels it. Two replicas, two producers of multi-event transactions over
// 40 hosts. Every partition keeps moving (none goes stallBound without a
// commit while it has events), every event is handled once, in host
// order, each producer transaction's slice of a partition in one consumer
// transaction, and none is dead-lettered (maxAttempts 10: a unit
// dead-letters only after ten timeouts alone, 0.3^10).
func TestRoleTimeoutsSlowStatement(t *testing.T) {
	const partitions = 8
	url, pool := migrated(t, partitions)
	resetRole := setRoleTimeouts(t, pool, url, map[string]string{"statement_timeout": "200ms", "idle_in_transaction_session_timeout": "1s"})
	cfg := writeConfig(t, roleTimeoutsConfig(partitions, `CASE WHEN random() < 0.3 THEN pg_sleep(0.3) END`, "maxAttempts: 10\nretryMaxMs: 1000"))
	var procs []*proc
	for range 2 {
		procs = append(procs, start(t, url, "run", "--config", cfg))
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	stopProducing := make(chan struct{})
	committed := produceMixed(t, pool, seed, 2, 0.02, stopProducing)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mon := &stallMonitor{}
	monDone := make(chan struct{})
	go func() { defer close(monDone); mon.run(ctx, t, pool) }()
	time.AfterFunc(20*time.Second, func() { close(stopProducing) })
	n := committed()
	if t.Failed() {
		return
	}
	eventtest.WaitHandled(t, pool, n, 2*time.Minute)
	cancel()
	<-monDone
	resetRole() // the checks read the whole log: not under the role's 200 ms
	eventtest.CheckHandled(t, pool)
	if dl := eventtest.QueryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`); dl != 0 {
		t.Errorf("%d units dead-lettered; a statement that times out 30 %% of the time must pass within maxAttempts (seed %d)", dl, seed)
	}
	slow := eventtest.QueryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE event_type = 'slow'`)
	t.Logf("%d events (%d slow) handled once, in order; longest stall of a partition with pending events %s (%s)",
		n, slow, mon.maxStall.Round(time.Millisecond), mon.worst)
	if mon.maxStall > stallBound {
		t.Errorf("a partition with pending events went %s without a commit (%s), more than %s (seed %d)",
			mon.maxStall.Round(time.Millisecond), mon.worst, stallBound, seed)
	}
	for _, pr := range procs {
		if code := pr.stop(t, 15*time.Second); code != 0 {
			t.Errorf("consumer exited with %d after SIGTERM, want 0", code)
		}
	}
}

// TestStatementTimeoutDeadLettersItsUnit is case 3 of issue 46: a
// handler's statement that always outlasts statement_timeout
// (statementTimeoutMs 200, the statement sleeps 0.3 s) is a timeout of its
// unit, as a handlerTimeoutMs expiry is: after maxAttempts its unit is
// dead-lettered, naming the timeout, and the event behind it, on the same
// host in a later transaction, is handled. On main it was retried forever.
func TestStatementTimeoutDeadLettersItsUnit(t *testing.T) {
	url, pool := migrated(t, 1)
	cfg := strings.Replace(roleTimeoutsConfig(1, `pg_sleep(0.3)`, "maxAttempts: 3\nretryMaxMs: 200"),
		"statementTimeoutMs: 0\n", "statementTimeoutMs: 200\n", 1)
	p := start(t, url, "run", "--config", writeConfig(t, cfg))
	ctx := context.Background()
	for _, typ := range []string{"t", "slow", "t"} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pgevents.Append(ctx, tx, pgevents.Event{HostID: "h", EventType: typ, Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	eventtest.WaitHandled(t, pool, 2, time.Minute)
	var attempts int
	var reason string
	if err := pool.QueryRow(ctx, `SELECT attempts, error FROM dead_letter_queue`).Scan(&attempts, &reason); err != nil {
		t.Fatalf("the slow unit's dead letter: %v", err)
	}
	if attempts != 3 || !strings.Contains(reason, "statement timeout") {
		t.Errorf("dead letter after %d attempts, %q; want 3 attempts naming the statement timeout", attempts, reason)
	}
	if got := eventtest.QueryInt(t, pool, `SELECT count(*) FROM handled h JOIN outbox_message_t m USING (c_offset) WHERE m.event_type = 't'`); got != 2 {
		t.Errorf("%d ordinary events handled, want 2", got)
	}
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Errorf("consumer exited with %d after SIGTERM, want 0", code)
	}
}

// TestRoleIdleTimeoutTooShortExitsTwo: an
// idle_in_transaction_session_timeout set on the role (ALTER ROLE ... IN
// DATABASE ... SET) too short for handlerTimeoutMs and a batch's round
// trips is refused at start with status 2, naming the key, the setting,
// where it comes from and the role; one with room is accepted.
func TestRoleIdleTimeoutTooShortExitsTwo(t *testing.T) {
	url, pool := migrated(t, 1)
	setRoleTimeouts(t, pool, url, map[string]string{"idle_in_transaction_session_timeout": "1s"})
	var role string
	if err := pool.QueryRow(context.Background(), `SELECT current_user`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, strings.Replace(roleTimeoutsConfig(1, `1`, ""), "handlerTimeoutMs: 500", "handlerTimeoutMs: 950", 1))
	code, out := runOnce(t, url, "run", "--config", cfg)
	for _, want := range []string{"handlerTimeoutMs", "idle_in_transaction_session_timeout 1s", "ALTER ROLE", fmt.Sprintf("role %q", role)} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not name %q:\n%s", want, out)
		}
	}
	if code != 2 {
		t.Fatalf("consumer run exited %d, want 2:\n%s", code, out)
	}
	// 500 ms of handler budget leaves room in 1 s: it runs.
	p := start(t, url, "run", "--config", writeConfig(t, roleTimeoutsConfig(1, `1`, "")))
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pgevents.Append(ctx, tx, pgevents.Event{HostID: "h", EventType: "t", Payload: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	eventtest.WaitHandled(t, pool, 1, 30*time.Second)
	if code := p.stop(t, 15*time.Second); code != 0 {
		t.Errorf("consumer exited with %d after SIGTERM, want 0", code)
	}
}
