package consumercli

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// TestSequencedTopicThroughTheBinary: a topic migrated with offsetScope
// sequenced; events appended from SQL while no process runs stay staged,
// `consumer maintain --once` sequences them; then two consumer processes
// run (one of them sequences), events appended in multi-host transactions
// are handled exactly once, in host order, and the sequencer moves to the
// other process when its process is killed with SIGKILL.
func TestSequencedTopicThroughTheBinary(t *testing.T) {
	url := pgtest.NewDB(t)
	cfg := writeConfig(t, strings.Replace(recordingConfig(4, -1, 10), "offsetScope: "+pgtest.Scope(), "offsetScope: sequenced", 1))
	if code, out := runOnce(t, url, "migrate", "--config", cfg); code != 0 {
		t.Fatalf("consumer migrate: exit %d\n%s", code, out)
	}
	pool := pgtest.Pool(t, url)
	eventtest.Exec(t, pool, eventtest.HandledTable)
	appendTx := func(tx, events int) {
		t.Helper()
		evs := make([]string, events)
		for i := range evs {
			evs[i] = fmt.Sprintf(`{"host_id": "h%d", "event_type": "t", "payload": {"tx": %d}}`, (tx+i)%7, tx)
		}
		eventtest.Exec(t, pool, `SELECT append_events(1, '[`+strings.Join(evs, ",")+`]'::jsonb)`)
	}
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
