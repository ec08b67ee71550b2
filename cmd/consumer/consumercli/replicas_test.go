package consumercli

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// chaosDuration is how long producers run in TestReplicaChaos; the issue
// asks for 60 s. PGEVENTS_CHAOS_SECONDS shortens it for a quick local run.
func chaosDuration() time.Duration {
	if s := os.Getenv("PGEVENTS_CHAOS_SECONDS"); s != "" {
		var n int
		if _, err := fmt.Sscan(s, &n); err == nil && n > 0 {
			return time.Duration(n) * time.Second
		}
	}
	return 60 * time.Second
}

// stallMonitor samples every partition's progress and remembers the
// longest time a partition with lag went without its position moving, and
// the longest it went with lag and no live lease.
type stallMonitor struct {
	mu           sync.Mutex
	maxStall     time.Duration
	maxOwnerless time.Duration
	worst        string
}

func (m *stallMonitor) run(ctx context.Context, t *testing.T, pool *pgxpool.Pool) {
	type state struct {
		next        int64
		since       time.Time // lag and no progress since
		ownerlessAt time.Time // lag and no live lease since
	}
	states := map[int]*state{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rows, err := pool.Query(ctx, `SELECT o.partition_id, o.next_offset,
				EXISTS (SELECT 1 FROM outbox_message_t m WHERE m.topic_id = 1 AND m.partition_id = o.partition_id
				        AND m.c_offset >= o.next_offset) AS lag,
				coalesce((SELECT live FROM partition_ownership w WHERE w.group_id = o.group_id
				          AND w.topic_id = 1 AND w.partition_id = o.partition_id), false)
			FROM consumer_offsets o WHERE o.group_id = 'g' AND o.topic_id = 1`)
		if err != nil {
			continue
		}
		now := time.Now()
		var (
			p         int
			next      int64
			lag, live bool
		)
		_, err = pgx.ForEachRow(rows, []any{&p, &next, &lag, &live}, func() error {
			s := states[p]
			if s == nil {
				s = &state{next: next}
				states[p] = s
			}
			if !lag || next != s.next {
				s.since = time.Time{}
			} else if s.since.IsZero() {
				s.since = now
			}
			s.next = next
			if lag && !live {
				if s.ownerlessAt.IsZero() {
					s.ownerlessAt = now
				}
			} else {
				s.ownerlessAt = time.Time{}
			}
			m.mu.Lock()
			if !s.since.IsZero() && now.Sub(s.since) > m.maxStall {
				m.maxStall = now.Sub(s.since)
				m.worst = fmt.Sprintf("partition %d stalled at offset %d", p, next)
			}
			if !s.ownerlessAt.IsZero() && now.Sub(s.ownerlessAt) > m.maxOwnerless {
				m.maxOwnerless = now.Sub(s.ownerlessAt)
			}
			m.mu.Unlock()
			return nil
		})
		if err != nil && ctx.Err() == nil {
			t.Logf("monitor: %v", err)
		}
	}
}

// TestReplicaChaos: 3 replicas in auto mode share 16 partitions while
// producers append for 60 s; every 5 s a random replica is killed with
// SIGKILL (and restarted) or frozen with SIGSTOP for twice the lease (and
// resumed). Every event is handled exactly once in host order, leases are
// balanced within 5 s of the last change, and no partition with lag goes
// more than 3 s without progress or without an owner.
func TestReplicaChaos(t *testing.T) {
	url, pool := migrated(t, 16)
	cfg := writeConfig(t, recordingConfig(16, -1, 20)+"leaseMs: 1000\n")
	procs := make([]*proc, 3)
	for i := range procs {
		procs[i] = start(t, url, "run", "--config", cfg)
	}
	pgtest.WaitFor(t, 10*time.Second, "16 partitions owned", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_ownership WHERE live`) == 16
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mon := &stallMonitor{}
	monDone := make(chan struct{})
	go func() { defer close(monDone); mon.run(ctx, t, pool) }()

	// Producers: transactions of 1-5 events over 100 hosts.
	prodCtx, stopProducers := context.WithTimeout(ctx, chaosDuration())
	defer stopProducers()
	var committed atomic.Int64
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 9))
			for prodCtx.Err() == nil {
				evs := make([]pgevents.Event, 1+rng.IntN(5))
				host := fmt.Sprintf("host-%d", rng.IntN(100))
				for k := range evs {
					evs[k] = pgevents.Event{HostID: host, EventType: "t", Payload: []byte(`{}`)}
				}
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := pgevents.Append(ctx, tx, evs...)
					return err
				})
				if err != nil {
					t.Error(err)
					return
				}
				committed.Add(int64(len(evs)))
				select {
				case <-prodCtx.Done():
				case <-time.After(2 * time.Millisecond):
				}
			}
		}()
	}

	// Chaos: every 5 s, kill or freeze a random replica.
	rng := rand.New(rand.NewPCG(1, 2))
	var lastChange time.Time
	kills, freezes := 0, 0
	tick := time.NewTicker(5 * time.Second)
	for done := false; !done; {
		select {
		case <-prodCtx.Done():
			done = true
			continue
		case <-tick.C:
		}
		i := rng.IntN(len(procs))
		if rng.IntN(2) == 0 {
			_ = procs[i].cmd.Process.Signal(syscall.SIGKILL)
			<-procs[i].done
			procs[i] = start(t, url, "run", "--config", cfg)
			kills++
		} else {
			_ = procs[i].cmd.Process.Signal(syscall.SIGSTOP)
			time.Sleep(2 * time.Second) // the fault being simulated: frozen for twice the lease
			_ = procs[i].cmd.Process.Signal(syscall.SIGCONT)
			freezes++
		}
		lastChange = time.Now()
	}
	tick.Stop()
	wg.Wait()
	if t.Failed() {
		return
	}

	// Balanced within 5 s of the last change.
	pgtest.WaitFor(t, time.Until(lastChange.Add(5*time.Second))+100*time.Millisecond, "leases balanced 6/5/5", func() bool {
		rows, err := pool.Query(ctx, `SELECT count(*) FROM partition_ownership WHERE live GROUP BY owner ORDER BY 1`)
		if err != nil {
			return false
		}
		counts, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		return err == nil && fmt.Sprint(counts) == "[5 5 6]"
	})
	eventtest.WaitHandled(t, pool, committed.Load(), 60*time.Second)
	cancel()
	<-monDone
	eventtest.CheckHandled(t, pool)
	t.Logf("%d events; %d kills, %d freezes; longest stall %s (%s), longest ownerless with lag %s",
		committed.Load(), kills, freezes, mon.maxStall, mon.worst, mon.maxOwnerless)
	if mon.maxStall > 3*time.Second {
		t.Errorf("a partition with lag made no progress for %s (%s)", mon.maxStall, mon.worst)
	}
	if mon.maxOwnerless > 3*time.Second {
		t.Errorf("a partition with lag had no live owner for %s", mon.maxOwnerless)
	}
	for _, p := range procs {
		if code := p.stop(t, 15*time.Second); code != 0 {
			t.Errorf("replica exited with %d after SIGTERM", code)
		}
	}
}

// TestFencingFrozenInsideHandler freezes a replica while its handler is in
// the middle of a batch, lets its lease expire and a standby take over, and
// resumes it: the frozen replica's batch does not commit, and the standby's
// effects stand alone, under a higher epoch.
func TestFencingFrozenInsideHandler(t *testing.T) {
	url, pool := migrated(t, 2)
	ctx := context.Background()
	eventtest.Exec(t, pool, `ALTER TABLE handled ADD COLUMN epoch bigint`)
	eventtest.Exec(t, pool, `CREATE FUNCTION record_or_wait(p_offset bigint, p_host text, p_partition int, p_tx bigint, p_epoch bigint)
		RETURNS void LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO handled (c_offset, host_id, partition_id, transaction_id, epoch)
			VALUES (p_offset, p_host, p_partition, p_tx, p_epoch);
			IF p_host LIKE 'fence%' THEN
				PERFORM pg_advisory_xact_lock_shared(777);
			END IF;
		END $$`)
	cfgText := strings.Replace(recordingConfig(2, 0, 10), strings.Join(strings.Fields(eventtest.RecordSQL), " "),
		"SELECT record_or_wait(@c_offset, @host_id, @partition_id, @transaction_id, @epoch)", 1) + "leaseMs: 800\n"
	// Leases taken and lost, and fences, are logged at info: a failure
	// shows them.
	cfgText = strings.Replace(cfgText, "logLevel: warn", "logLevel: info", 1)
	cfg := writeConfig(t, cfgText)

	holder, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_lock(777)`); err != nil {
		t.Fatal(err)
	}
	first := start(t, url, "run", "--config", cfg)
	pgtest.WaitFor(t, 10*time.Second, "first replica holds partition 0", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_ownership WHERE partition_id = 0 AND live`) == 1
	})
	standby := start(t, url, "run", "--config", cfg)

	// Hosts of partition 0, the one both replicas are configured for.
	host := func(prefix string) string {
		for i := 0; ; i++ {
			h := fmt.Sprintf("%s%d", prefix, i)
			if eventtest.QueryInt(t, pool, `SELECT event_partition($1, 2)`, h) == 0 {
				return h
			}
		}
	}
	fence, other := host("fence"), host("other")
	appendTx := func(hosts ...string) {
		evs := make([]pgevents.Event, len(hosts))
		for i, h := range hosts {
			evs[i] = pgevents.Event{HostID: h, EventType: "t", Payload: []byte(`{}`)}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := pgevents.Append(ctx, tx, evs...)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	appendTx(other)
	appendTx(other, fence, other) // the handler waits inside this unit
	pgtest.WaitFor(t, 10*time.Second, "handler waiting inside the batch", func() bool {
		// Waiting for lock 777 itself: appends and claims wait on advisory
		// locks of their own (a partition's append lock, an append in
		// flight), and one of those once passed for the handler.
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND classid = 0 AND objid = 777 AND objsubid = 1
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 1
	})
	// The owner is the first replica, unless a loaded machine delayed its
	// heartbeat past the lease and the standby took over (fencing the
	// first's batch) before the handler began to wait: freeze whichever
	// owns the partition, under the epoch it owns it with.
	var firstEpoch, ownerPID int64
	if err := pool.QueryRow(ctx, `SELECT l.epoch, r.pid FROM partition_leases l
		JOIN consumer_replicas r ON r.group_id = l.group_id AND r.topic_id = l.topic_id AND r.replica_id = l.owner
		WHERE l.partition_id = 0`).Scan(&firstEpoch, &ownerPID); err != nil {
		t.Fatal(err)
	}
	if int(ownerPID) == standby.cmd.Process.Pid {
		first = standby
	}

	// Freeze the replica inside its handler, then let the handler's
	// statement finish: its effect is written, uncommitted, in a
	// transaction whose client is frozen.
	first.freeze(t)
	defer first.cmd.Process.Signal(syscall.SIGCONT) //nolint:errcheck
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock(777)`); err != nil {
		t.Fatal(err)
	}
	// The standby takes over once the lease expires, ends the frozen
	// batch's backend, and handles the unit itself.
	eventtest.WaitHandled(t, pool, 4, 30*time.Second)
	if err := first.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	appendTx(other) // both replicas live again: only the lease owner handles it
	eventtest.WaitHandled(t, pool, 5, 10*time.Second)
	eventtest.CheckHandled(t, pool)
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM handled WHERE c_offset >= 2 AND epoch <= $1`, firstEpoch); n != 0 {
		var rows, leases string
		_ = pool.QueryRow(ctx, `SELECT string_agg(format('%s@%s', c_offset, epoch), ' ' ORDER BY c_offset) FROM handled`).Scan(&rows)
		_ = pool.QueryRow(ctx, `SELECT string_agg(format('p%s %s epoch %s', partition_id, owner, epoch), '; ') FROM partition_leases`).Scan(&leases)
		t.Fatalf("%d effects of the frozen replica's batch (epoch %d, pid %d) were committed: handled %s; leases %s",
			n, firstEpoch, ownerPID, rows, leases)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(DISTINCT epoch) FROM handled WHERE c_offset BETWEEN 2 AND 4`); n != 1 {
		t.Fatalf("the fenced unit was handled under %d epochs", n)
	}
}

// TestRepartitionCommand: `consumer repartition` records the new layout;
// a consumer still configured with the old count then exits with status 2
// naming the key and the command, and one with the new count runs.
func TestRepartitionCommand(t *testing.T) {
	url, pool := migrated(t, 8)
	cfg8 := writeConfig(t, recordingConfig(8, -1, 10))
	if code, out := runOnce(t, url, "repartition", "--config", cfg8, "--partitions", "0"); code != 2 {
		t.Fatalf("--partitions 0: exit %d, want 2\n%s", code, out)
	}
	code, out := runOnce(t, url, "repartition", "--config", cfg8, "--partitions", "12")
	want := "8 -> 12 partitions from offset 1" // the topic is empty
	if pgtest.Scope() == schema.ScopePartition {
		want = "8 -> 12 partitions from each partition's next offset"
	}
	if code != 0 || !strings.Contains(out, want) {
		t.Fatalf("repartition: exit %d\n%s", code, out)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT total_partitions FROM log_counter WHERE topic_id = 1`); n != 12 {
		t.Fatalf("topic has %d partitions after repartition, want 12", n)
	}
	code, out = runOnce(t, url, "run", "--config", cfg8)
	if code != 2 || !strings.Contains(out, "totalPartitions") || !strings.Contains(out, "consumer repartition") {
		t.Fatalf("consumer configured for 8 after the change: exit %d, want 2 naming totalPartitions and the command\n%s", code, out)
	}
	cfg12 := writeConfig(t, recordingConfig(12, -1, 10))
	p := start(t, url, "run", "--config", cfg12)
	pgtest.WaitFor(t, 10*time.Second, "12 partitions owned", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM partition_ownership WHERE live`) == 12
	})
	// consumer status shows who owns what.
	code, out = runOnce(t, url, "status", "--config", cfg12, "--json")
	var st struct {
		Partitions []struct {
			Lease *struct {
				Owner string `json:"owner"`
				Epoch int64  `json:"epoch"`
			} `json:"lease"`
		} `json:"partitions"`
	}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || len(st.Partitions) != 12 {
		t.Fatalf("status --json: exit %d, %v\n%s", code, err, out)
	}
	for i, p := range st.Partitions {
		if p.Lease == nil || p.Lease.Owner == "" || p.Lease.Epoch < 1 {
			t.Fatalf("partition %d has no owner in status: %+v\n%s", i, p.Lease, out)
		}
	}
	if code := p.stop(t, 10*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
}

// TestSeveralGroupsInOneProcess: a configuration listing two groups runs
// both in one process, each handling every event once.
func TestSeveralGroupsInOneProcess(t *testing.T) {
	url, pool := migrated(t, 4)
	eventtest.Exec(t, pool, `CREATE TABLE fanout (group_id text, partition_id integer, c_offset bigint)`)
	cfg := writeConfig(t, `totalPartitions: 4
waitPeriodMs: 1000
logLevel: warn
groups:
  - groupId: emails
    handlers:
      - eventType: "*"
        type: sql
        statement: INSERT INTO fanout VALUES (@group_id, @partition_id, @c_offset)
  - groupId: search
    batchSize: 3
    handlers:
      - eventType: "*"
        type: sql
        statement: INSERT INTO fanout VALUES (@group_id, @partition_id, @c_offset)
`)
	p := start(t, url, "run", "--config", cfg)
	ctx := context.Background()
	for i := range 50 {
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := pgevents.Append(ctx, tx, pgevents.Event{HostID: fmt.Sprintf("h%d", i%9), EventType: "t"})
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	pgtest.WaitFor(t, 20*time.Second, "both groups handled 50 events", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM fanout`) >= 100
	})
	// An event is (partition, offset): offsets repeat across partitions
	// under scope partition.
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM (SELECT group_id, partition_id, c_offset FROM fanout GROUP BY 1, 2, 3 HAVING count(*) = 1) x`); n != 100 {
		t.Fatalf("%d (group, event) pairs handled exactly once, want 100", n)
	}
	if code := p.stop(t, 10*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
}

// TestGroupAndOffsetsCommands: pause and resume through the binary show in
// status; a reset is refused while the group runs unless forced, and prints
// what moved.
func TestGroupAndOffsetsCommands(t *testing.T) {
	url, pool := migrated(t, 2)
	// A lease of 10 s: the replica stays live through a stall of its
	// heartbeat on a loaded machine (with the default 1 s, a clean-clone
	// run saw the reset accepted as if the group had stopped).
	cfg := writeConfig(t, recordingConfig(2, -1, 10)+"deadAfterMs: 2000\nleaseMs: 10000\n")
	p := start(t, url, "run", "--config", cfg)
	pgtest.WaitFor(t, 10*time.Second, "group subscribed and its replica live", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM subscriptions WHERE group_id = 'g' AND state = 'ACTIVE'`) == 1 &&
			eventtest.QueryInt(t, pool, `SELECT count(*) FROM consumer_replicas WHERE group_id = 'g' AND expires_at > clock_timestamp()`) == 1
	})
	if code, out := runOnce(t, url, "group", "pause", "g", "--config", cfg); code != 0 || !strings.Contains(out, "ACTIVE -> PAUSED") {
		t.Fatalf("group pause: exit %d\n%s", code, out)
	}
	code, out := runOnce(t, url, "status", "--config", cfg, "--json")
	if code != 0 || !strings.Contains(out, `"subscription": "PAUSED"`) {
		t.Fatalf("status after pause: exit %d\n%s", code, out)
	}
	if code, out := runOnce(t, url, "group", "resume", "g", "--config", cfg); code != 0 || !strings.Contains(out, "PAUSED -> ACTIVE") {
		t.Fatalf("group resume: exit %d\n%s", code, out)
	}
	if code, out := runOnce(t, url, "group", "freeze", "g", "--config", cfg); code != 2 {
		t.Fatalf("group freeze: exit %d, want 2\n%s", code, out)
	}
	code, out = runOnce(t, url, "offsets", "reset", "--group", "g", "--to", "earliest", "--config", cfg)
	if code != 1 || !strings.Contains(out, "running") {
		t.Fatalf("reset while running: exit %d, want 1 saying the group runs\n%s", code, out)
	}
	code, out = runOnce(t, url, "offsets", "reset", "--group", "g", "--to", "latest", "--force", "--config", cfg)
	if code != 0 || !strings.Contains(out, "partition 0: 1 -> 1") {
		t.Fatalf("forced reset: exit %d\n%s", code, out)
	}
	if code, out := runOnce(t, url, "offsets", "reset", "--group", "g", "--to", "yesterday", "--config", cfg); code != 2 {
		t.Fatalf("reset to a bad position: exit %d, want 2\n%s", code, out)
	}
	if code := p.stop(t, 10*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
}
