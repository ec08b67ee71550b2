package consumercli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// watchKeySessions returns how many sessions hold topic 1's watch key,
// how many wait for it, and how many watchers' sessions there are (a
// killed process's session lasts until the server notices).
func watchKeySessions(t *testing.T, pool *pgxpool.Pool) (held, waiting, sessions int64) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE l.granted), count(*) FILTER (WHERE NOT l.granted),
       (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'pgevents watcher %')
FROM pg_locks l, (SELECT lock_key('watch', '1') AS k) s
WHERE l.locktype = 'advisory' AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((s.k >> 32) & 4294967295)::oid AND l.objid = (s.k & 4294967295)::oid`).Scan(&held, &waiting, &sessions)
	if err != nil {
		t.Fatal(err)
	}
	return held, waiting, sessions
}

// hourPollConfig writes the configuration of a process serving partition p
// of a topic of partitions, with the poll at an hour (an event no
// notification announced waits for it) and info logs (the election is
// logged).
func hourPollConfig(t *testing.T, partitions, p int) string {
	t.Helper()
	c := recordingConfig(partitions, p, 10)
	c = strings.Replace(c, "waitPeriodMs: 1000", "waitPeriodMs: 3600000", 1)
	return writeConfig(t, strings.Replace(c, "logLevel: warn", "logLevel: info", 1))
}

// appendRandom appends, in one transaction, 1 to max events for hosts out
// of 30, and returns how many.
func appendRandom(ctx context.Context, pool *pgxpool.Pool, rng *rand.Rand, max int) (int64, error) {
	evs := make([]pgevents.Event, 1+rng.IntN(max))
	for i := range evs {
		evs[i] = pgevents.Event{HostID: fmt.Sprintf("host-%d", rng.IntN(30)), EventType: "t", Payload: []byte(`{}`)}
	}
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := pgevents.Append(ctx, tx, evs...)
		return err
	})
	return int64(len(evs)), err
}

// electedProcess returns the index of the process that logged its
// election, or fails the test.
func electedProcess(t *testing.T, procs []*proc) int {
	t.Helper()
	for p, pr := range procs {
		if strings.Contains(pr.out.String(), "elected the topic's watcher") {
			return p
		}
	}
	t.Fatal("no process logged its election")
	return -1
}

// TestOneWatcherServesEveryProcess runs a consumer process per partition
// (static mode, as docs/deploying.md deploys it), with the poll at an hour: one process
// of the database is the topic's elected watcher and the others wait for
// its key. Each round, producers append multi-event transactions over
// several hosts, and every event must be handled within 10 s (a partition
// the watcher did not announce would wait for the poll); then the elected
// process is killed with SIGKILL and replaced, and another one must take
// the key. Every event is handled once, in host order.
func TestOneWatcherServesEveryProcess(t *testing.T) {
	const partitions = 4
	url, pool := migrated(t, partitions)
	config := func(p int) string { return hourPollConfig(t, partitions, p) }
	procs := make([]*proc, partitions)
	for p := range procs {
		procs[p] = start(t, url, "run", "--config", config(p))
	}
	oneWatcher := func(when string) {
		t.Helper()
		pgtest.WaitFor(t, 20*time.Second, "one watcher elected, the others waiting ("+when+")", func() bool {
			held, waiting, sessions := watchKeySessions(t, pool)
			return held == 1 && waiting == partitions-1 && sessions == partitions
		})
	}
	oneWatcher("at start")
	// consumer status names it.
	code, out := runOnce(t, url, "status", "--config", config(0), "--json")
	var doc struct {
		Watcher *struct {
			Session string `json:"session"`
			Waiting int    `json:"waiting"`
		} `json:"watcher"`
	}
	if err := json.Unmarshal([]byte(out), &doc); code != 0 || err != nil || doc.Watcher == nil ||
		!strings.HasPrefix(doc.Watcher.Session, "pgevents watcher ") || doc.Watcher.Waiting != partitions-1 {
		t.Fatalf("consumer status --json: exit %d, %v; want the elected watcher and %d waiting:\n%s", code, err, partitions-1, out)
	}

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	ctx := context.Background()
	var committed int64
	for round := range 3 {
		for range 40 {
			n, err := appendRandom(ctx, pool, rng, 5)
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			committed += n
			time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond) // producers' pace, not synchronisation
		}
		// The poll is an hour away: an event no notification announced
		// waits for it.
		eventtest.WaitHandled(t, pool, committed, 10*time.Second)
		if t.Failed() {
			t.Fatalf("seed %d: round %d", seed, round)
		}
		elected := electedProcess(t, procs)
		_ = procs[elected].cmd.Process.Signal(syscall.SIGKILL)
		<-procs[elected].done
		procs[elected] = start(t, url, "run", "--config", config(elected))
		oneWatcher(fmt.Sprintf("after the elected process %d was killed", elected))
	}
	eventtest.CheckHandled(t, pool)
	for _, p := range procs {
		if code := p.stop(t, 15*time.Second); code != 0 {
			t.Errorf("consumer exited with %d after SIGTERM, want 0", code)
		}
	}
}

// TestFrozenWatcherIsReplaced freezes (SIGSTOP) the elected watcher's
// process while producers append to every partition, with the poll at an
// hour: its session keeps the watch key, and the partitions it watched
// awake send no notification, so another process must end that session
// once the frozen replica's heartbeat has lapsed, take the key, and
// announce what the others' partitions hold. The frozen process's own
// partition waits for it (static partitions); once it is resumed, every
// event is handled once, in host order.
func TestFrozenWatcherIsReplaced(t *testing.T) {
	const partitions = 3
	url, pool := migrated(t, partitions)
	procs := make([]*proc, partitions)
	for p := range procs {
		procs[p] = start(t, url, "run", "--config", hourPollConfig(t, partitions, p))
	}
	pgtest.WaitFor(t, 20*time.Second, "one watcher elected, the others waiting", func() bool {
		held, waiting, sessions := watchKeySessions(t, pool)
		return held == 1 && waiting == partitions-1 && sessions == partitions
	})
	frozen := electedProcess(t, procs)

	ctx := context.Background()
	// The producer stops between transactions: a transaction cut off in
	// its commit might commit uncounted.
	var stop atomic.Bool
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d; freezing the elected process %d", seed, frozen)
	rng := rand.New(rand.NewPCG(seed, 2))
	var committed atomic.Int64
	produced := make(chan error, 1)
	go func() {
		for !stop.Load() {
			n, err := appendRandom(ctx, pool, rng, 3)
			if err != nil {
				produced <- err
				return
			}
			committed.Add(n)
			time.Sleep(2 * time.Millisecond) // producers' pace, not synchronisation
		}
		produced <- nil
	}()
	// Events flow, so the partitions are awake: appends notify nobody.
	pgtest.WaitFor(t, 10*time.Second, "100 events handled", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM handled`) >= 100
	})
	procs[frozen].freeze(t)
	frozenAt := time.Now()
	// Appended after the freeze to the other processes' partitions: handled
	// once another watcher is elected (the poll is an hour away).
	mark := eventtest.QueryInt(t, pool, `SELECT coalesce(max(c_offset), 0) FROM outbox_message_t WHERE partition_id <> $1`, frozen)
	pgtest.WaitFor(t, 15*time.Second, "events appended to the live processes' partitions after the freeze handled", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM outbox_message_t m WHERE m.partition_id <> $1 AND m.c_offset > $2
			AND NOT EXISTS (SELECT 1 FROM handled h WHERE h.c_offset = m.c_offset AND h.partition_id = m.partition_id)`, frozen, mark) == 0 &&
			eventtest.QueryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE partition_id <> $1 AND c_offset > $2`, frozen, mark) > 0
	})
	t.Logf("the live partitions caught up %s after the freeze", time.Since(frozenAt).Round(time.Millisecond))
	stop.Store(true)
	if err := <-produced; err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	_ = procs[frozen].cmd.Process.Signal(syscall.SIGCONT)
	eventtest.WaitHandled(t, pool, committed.Load(), 30*time.Second)
	eventtest.CheckHandled(t, pool)
	for _, p := range procs {
		if code := p.stop(t, 15*time.Second); code != 0 {
			t.Errorf("consumer exited with %d after SIGTERM, want 0", code)
		}
	}
}

// TestStopWhileStartingExitsZero: a consumer asked to stop (SIGTERM: its
// context ends) before it has finished starting exits 0, as after any
// graceful stop, not 1 with the start's "context canceled". A test that
// stopped a freshly restarted process saw exit 1.
func TestStopWhileStartingExitsZero(t *testing.T) {
	url, _ := migrated(t, 4)
	t.Setenv("DATABASE_URL", url)
	cfg := writeConfig(t, recordingConfig(4, -1, 10))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var stdout, stderr bytes.Buffer
	if code := Main(ctx, []string{"run", "--config", cfg}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d, want %d after a stop while starting\n%s", code, exitOK, stderr.String())
	}
}
