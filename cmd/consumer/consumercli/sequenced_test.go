package consumercli

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// sequencedFixture is a database with a sequenced topic of 4 partitions,
// created by `consumer migrate` from cfg, and the handled table.
type sequencedFixture struct {
	url, cfg string
	pool     *pgxpool.Pool
	appended int // events appended by appendTx
}

func newSequencedFixture(t *testing.T) *sequencedFixture {
	t.Helper()
	f := &sequencedFixture{url: pgtest.NewDB(t)}
	f.cfg = writeConfig(t, strings.Replace(recordingConfig(4, -1, 10), "offsetScope: "+pgtest.Scope(), "offsetScope: sequenced", 1))
	if code, out := runOnce(t, f.url, "migrate", "--config", f.cfg); code != 0 {
		t.Fatalf("consumer migrate: exit %d\n%s", code, out)
	}
	f.pool = pgtest.Pool(t, f.url)
	eventtest.Exec(t, f.pool, eventtest.HandledTable)
	return f
}

// appendTx appends, in one transaction (number tx), events over hosts h0
// to h6.
func (f *sequencedFixture) appendTx(t *testing.T, tx, events int) {
	t.Helper()
	evs := make([]string, events)
	for i := range evs {
		evs[i] = fmt.Sprintf(`{"host_id": "h%d", "event_type": "t", "payload": {"tx": %d}}`, (tx+i)%7, tx)
	}
	eventtest.Exec(t, f.pool, `SELECT append_events(1, '[`+strings.Join(evs, ",")+`]'::jsonb)`)
	f.appended += events
}

// TestSequencedTopicThroughTheBinary: a topic migrated with offsetScope
// sequenced; events appended from SQL while no process runs stay staged,
// `consumer maintain --once` sequences them; then two consumer processes
// run (one of them sequences), events appended in multi-host transactions
// are handled exactly once, in host order, and the sequencer moves to the
// other process when its process is killed with SIGKILL.
func TestSequencedTopicThroughTheBinary(t *testing.T) {
	f := newSequencedFixture(t)
	url, cfg, pool := f.url, f.cfg, f.pool
	appendTx := func(tx, events int) { f.appendTx(t, tx, events) }
	for i := range 5 {
		appendTx(i, 2)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM outbox_message_t`); n != 0 {
		t.Fatalf("%d events in the log before any sequencer ran", n)
	}
	if code, out := runOnce(t, url, "maintain", "--once", "--config", cfg); code != 0 || !strings.Contains(out, "topic 1: 10 staged events sequenced") {
		t.Fatalf("maintain --once: exit %d\n%s", code, out)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM outbox_message_t`); n != 10 {
		t.Fatalf("%d events in the log after maintain --once, want 10", n)
	}
	a := start(t, url, "run", "--config", cfg)
	b := start(t, url, "run", "--config", cfg)
	// The session holding the sequencer key: the other waits for it.
	holder := func() string {
		var app string
		_ = pool.QueryRow(context.Background(), `SELECT coalesce(max(application_name), '') FROM pg_stat_activity
			WHERE application_name LIKE 'pgevents sequencer %' AND wait_event IS DISTINCT FROM 'advisory'`).Scan(&app)
		return app
	}
	pgtest.WaitFor(t, 10*time.Second, "one process sequences, the other waits", func() bool {
		return holder() != "" && eventtest.QueryInt(t, pool, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name LIKE 'pgevents sequencer %' AND wait_event = 'advisory'`) == 1
	})
	for i := range 20 {
		appendTx(100+i, 1+i%5)
	}
	pgtest.WaitFor(t, 20*time.Second, "every event handled", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM handled`) == 10+60 // 20 transactions of 1 to 5
	})
	// The process holding the key killed: the other one sequences.
	app := holder()
	killed, other := a, b
	if strings.Contains(app, fmt.Sprintf("-%d-", b.cmd.Process.Pid)) {
		killed, other = b, a
	} else if !strings.Contains(app, fmt.Sprintf("-%d-", a.cmd.Process.Pid)) {
		t.Fatalf("sequencer session %q is neither process's (%d, %d)", app, a.cmd.Process.Pid, b.cmd.Process.Pid)
	}
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		appendTx(200+i, 3)
	}
	pgtest.WaitFor(t, 20*time.Second, "every event handled after the kill", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM outbox_message_t`) == 10+60+30 &&
			eventtest.QueryInt(t, pool, `SELECT count(DISTINCT (partition_id, c_offset)) FROM handled`) == 100
	})
	eventtest.CheckHandled(t, pool)
	if code := other.stop(t, 10*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
}

// TestFrozenSequencerIsReplaced: two consumer processes of a sequenced
// topic of 4 partitions (auto mode); the one whose session holds the
// sequencer key is frozen with SIGSTOP. Its session lives on, and keeps the
// key: the other process must end it (the frozen replica no longer
// heartbeats, its session runs no statement) and sequence, so that events
// appended during the freeze are handled within seconds, not when the
// freeze ends. Once the frozen process is resumed (SIGCONT) it finds its
// session gone and waits for the key again: every event is sequenced once
// (one row per event id in the log) and handled once, in host order.
func TestFrozenSequencerIsReplaced(t *testing.T) {
	f := newSequencedFixture(t)
	url, cfg, pool := f.url, f.cfg, f.pool
	appendTx := func(tx, events int) { f.appendTx(t, tx, events) }
	procs := []*proc{start(t, url, "run", "--config", cfg), start(t, url, "run", "--config", cfg)}
	// The session holding the sequencer key, and how many wait for it.
	holder := func() (string, int64) {
		var app string
		var waiting int64
		_ = pool.QueryRow(context.Background(), `SELECT coalesce(max(a.application_name) FILTER (WHERE l.granted), ''), count(*) FILTER (WHERE NOT l.granted)
			FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid, (SELECT lock_key('sequencer', '1') AS k) s
			WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND l.classid = ((s.k >> 32) & 4294967295)::oid AND l.objid = (s.k & 4294967295)::oid`).Scan(&app, &waiting)
		return app, waiting
	}
	pgtest.WaitFor(t, 20*time.Second, "one process sequences, the other waits", func() bool {
		app, waiting := holder()
		return app != "" && waiting == 1
	})
	for i := range 10 {
		appendTx(i, 1+i%4)
	}
	eventtest.WaitHandled(t, pool, int64(f.appended), 20*time.Second)

	app, _ := holder()
	frozen := -1
	for i, p := range procs {
		if strings.Contains(app, fmt.Sprintf("-%d-", p.cmd.Process.Pid)) {
			frozen = i
		}
	}
	if frozen < 0 {
		t.Fatalf("sequencer session %q is neither process's (%d, %d)", app, procs[0].cmd.Process.Pid, procs[1].cmd.Process.Pid)
	}
	procs[frozen].freeze(t)
	frozenAt := time.Now()
	for i := range 20 {
		appendTx(100+i, 1+i%5)
	}
	// Handled within seconds of the freeze (the other process ends the
	// frozen session within about 4 s, and takes over the frozen
	// replica's partitions after its lease), while the freeze lasts.
	eventtest.WaitHandled(t, pool, int64(f.appended), 10*time.Second)
	t.Logf("events appended during the freeze handled %s after it", time.Since(frozenAt).Round(time.Millisecond))
	if got, _ := holder(); got == app {
		t.Fatalf("the frozen process's session %q still holds the sequencer key", app)
	}
	if !strings.Contains(procs[1-frozen].out.String(), "ended the session of the topic's sequencer") {
		t.Errorf("the live process did not log that it ended the frozen sequencer's session")
	}

	// Thawed: the frozen process finds its session ended and waits for the
	// key again; nothing is sequenced or handled twice.
	if err := procs[frozen].cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 20*time.Second, "the thawed process waits for the sequencer key", func() bool {
		_, waiting := holder()
		return waiting == 1
	})
	for i := range 10 {
		appendTx(200+i, 1+i%3)
	}
	eventtest.WaitHandled(t, pool, int64(f.appended), 20*time.Second)
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM outbox_message_t`); n != int64(f.appended) {
		t.Errorf("%d events in the log, want the %d appended", n, f.appended)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) - count(DISTINCT event_id) FROM outbox_message_t`); n != 0 {
		t.Errorf("%d staged events sequenced twice", n)
	}
	eventtest.CheckHandled(t, pool)
	for _, p := range procs {
		if code := p.stop(t, 15*time.Second); code != 0 {
			t.Errorf("consumer exited with %d after SIGTERM, want 0", code)
		}
	}
}
