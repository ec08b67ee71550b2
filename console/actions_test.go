package console_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/pgeventstest"
)

// startGroup runs a consumer of group g on env's topic (partitions
// partitions, failure policy policy) whose handler records each event in
// public.handled and fails permanently on a payload holding "poison"
// while poisoned is set. Its log goes to the returned buffer. edit, when
// given, adjusts its configuration.
func (e *env) startGroup(partitions int, policy pgevents.FailurePolicy, poisoned *atomic.Bool, edit ...func(*pgevents.Config)) (*pgevents.Consumer, *logtest.Buffer) {
	e.t.Helper()
	e.exec(eventtest.HandledTable)
	record := pgevents.SQLHandler("g", eventtest.RecordSQL)
	hs := &pgevents.Handlers{}
	hs.HandleAll(pgevents.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event) error {
		if poisoned.Load() && strings.Contains(string(ev.Payload), "poison") {
			return pgevents.Permanent(errors.New("poison event"))
		}
		return record.Handle(ctx, tx, ev)
	}))
	logs := logtest.New(e.t)
	log := zerolog.New(logs).Level(zerolog.TraceLevel)
	cfg := pgevents.Config{GroupID: "g", TotalPartitions: partitions, Handlers: hs,
		OnPermanentFailure: policy, DeadAfter: 2 * time.Second, Schema: pgtest.Schema(), Logger: &log}
	for _, f := range edit {
		f(&cfg)
	}
	c, _ := pgeventstest.StartConsumer(e.t, e.url, cfg)
	return c, logs
}

func (e *env) handled() int64 { return e.queryInt(`SELECT count(*) FROM handled`) }

// TestPauseResumeUnhalt: pause, resume and unhalt, from a browser session
// and from a script, do what they say to a running group (it stops
// handling, handles again, tries its halted unit again and gets past it),
// each with an audit row naming who did it, shown on the group's page,
// and a log line, from origin console; pausing a paused group succeeds
// and says so; an action the state does not allow (unhalting a partition
// not halted) changes nothing, and is recorded as failed.
func TestPauseResumeUnhalt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, console.Options{})
	var poisoned atomic.Bool
	poisoned.Store(true)
	_, clog := e.startGroup(1, pgevents.PolicyHalt, &poisoned)
	e.appendTx(ev("a", "t", `{}`))
	e.appendTx(ev("a", "t", `{"poison":true}`))
	e.appendTx(ev("b", "t", `{}`))
	waitFor(t, "the partition halted", func() bool { return e.queryInt(`SELECT count(*) FROM partition_halts`) == 1 })
	c := e.client()
	c.signIn("ada", testToken)
	group := "/topics/1/groups/g"

	// Unhalt, the cause fixed: the unit and what follows go through.
	poisoned.Store(false)
	r := c.post(group+"/unhalt", url.Values{"partition": {"0"}}, true)
	if r.status != http.StatusSeeOther || !strings.HasPrefix(r.header.Get("Location"), group+"?done=") {
		t.Fatalf("unhalt: %d %s\n%s", r.status, r.header.Get("Location"), r.body)
	}
	waitFor(t, "every event handled after the unhalt", func() bool { return e.handled() == 3 })
	if n := e.queryInt(`SELECT count(*) FROM partition_halts`); n != 0 {
		t.Fatalf("%d halt records after the unhalt", n)
	}
	if r := c.post(group+"/unhalt", url.Values{"partition": {"0"}}, true); r.status != http.StatusConflict {
		t.Fatalf("unhalt of a partition not halted: %d", r.status)
	}

	// Pause: the group handles nothing until resumed.
	if r := c.post(group+"/pause", nil, true); r.status != http.StatusSeeOther {
		t.Fatalf("pause: %d\n%s", r.status, r.body)
	}
	if s := e.queryInt(`SELECT count(*) FROM subscriptions WHERE group_id = 'g' AND state = 'PAUSED'`); s != 1 {
		t.Fatal("the subscription is not PAUSED")
	}
	waitFor(t, "the consumer follows the pause", func() bool { return strings.Contains(clog.String(), "PAUSED") })
	e.appendTx(ev("c", "t", `{}`))
	time.Sleep(time.Second)
	if n := e.handled(); n != 3 {
		t.Fatalf("a paused group handled %d events, want 3", n)
	}
	if r := c.post(group+"/pause", nil, true); r.status != http.StatusSeeOther {
		t.Fatalf("pause of a paused group: %d %s, want a success", r.status, r.header.Get("Location"))
	}
	if n := e.queryInt(`SELECT count(*) FROM console_audit WHERE action = 'pause' AND detail = 'already PAUSED' AND outcome = 'ok'`); n != 1 {
		t.Fatalf("the audit has %d rows saying a pause of a paused group found it already PAUSED, want 1", n)
	}
	// Resume, from a script.
	r = c.do(http.MethodPost, group+"/resume", url.Values{}, map[string]string{"Authorization": "Bearer " + testToken, "X-Console-Actor": "cron"})
	var res struct{ Action, Detail, Outcome string }
	if err := json.Unmarshal([]byte(r.body), &res); r.status != http.StatusOK || err != nil || res.Outcome != "ok" || res.Detail != "PAUSED -> ACTIVE" {
		t.Fatalf("resume by a script: %d %s (%v)", r.status, r.body, err)
	}
	waitFor(t, "the event appended while paused handled", func() bool { return e.handled() == 4 })

	// Who did what: rows, the page, the log.
	rows, err := e.pool.Query(e.ctx, `SELECT origin || ' ' || actor || ' ' || action || ' ' || outcome FROM console_audit ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"console ada unhalt ok", "console ada unhalt failed: the partition is not halted", "console ada pause ok", "console ada pause ok", "console cron resume ok"}
	if len(got) != len(want) {
		t.Fatalf("audit rows %q, want %q", got, want)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("audit row %d: %q, want %q…", i, got[i], want[i])
		}
	}
	page := c.mustGet(group)
	for _, a := range []string{"unhalt", "pause", "resume"} {
		if !strings.Contains(page, `data-action="`+a+`"`) {
			t.Errorf("the group page does not show the %s", a)
		}
	}
	logs := e.logs.String()
	for _, l := range []string{`"action":"pause","detail":"ACTIVE -> PAUSED"`, `"actor":"cron"`, `"action":"unhalt"`} {
		if !strings.Contains(logs, l) {
			t.Errorf("no log line with %s", l)
		}
	}
}

// TestReplayAndDiscard: dead letters replayed and discarded from the
// console, one or several at once, through the running consumer's
// handlers: a replayed unit is handled with the events parked behind it,
// a discarded one is not (its parked events are), and the dead letters
// go; each leaves an audit row with what it handled, shown on the dead
// letters' page, and a log line. A group whose handlers the console lacks
// keeps its dead letter, and the attempt is recorded as failed.
func TestReplayAndDiscard(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, console.Options{})
	var poisoned atomic.Bool
	poisoned.Store(true)
	cons, _ := e.startGroup(1, pgevents.PolicyParkHost, &poisoned)
	e.restart(console.Options{Resolvers: func(group string, topic int) console.Resolver {
		if group == "g" && topic == 1 {
			return cons
		}
		return nil
	}})
	e.appendTx(ev("a", "t", `{"poison":1}`)) // 1: dead letter, parks a
	e.appendTx(ev("b", "t", `{"poison":2}`)) // 2: dead letter, parks b
	e.appendTx(ev("a", "t", `{}`))           // 3: parked behind 1
	e.appendTx(ev("b", "t", `{}`))           // 4: parked behind 2
	e.appendTx(ev("c", "t", `{"poison":3}`)) // 5: dead letter
	e.appendTx(ev("d", "t", `{"poison":4}`)) // 6: dead letter
	e.appendTx(ev("z", "t", `{}`))           // 7: flows
	waitFor(t, "four dead letters", func() bool {
		return e.queryInt(`SELECT count(*) FROM dead_letter_queue`) == 4 && e.handled() == 1
	})
	dlOf := func(offset int) string {
		return strconv.FormatInt(e.queryInt(`SELECT id FROM dead_letter_queue WHERE first_offset = $1`, offset), 10)
	}
	dl1, dl2, dl5, dl6 := dlOf(1), dlOf(2), dlOf(5), dlOf(6)
	e.exec(`INSERT INTO dead_letter_queue (group_id, topic_id, partition_id, first_offset, last_offset, transaction_id,
		event_ids, host_ids, events, error, attempts, first_failed_at, last_failed_at)
		VALUES ('other', 1, 0, 1, 1, 1, '{}', '{x}', '[]', 'elsewhere', 1, now(), now())`)
	other := strconv.FormatInt(e.queryInt(`SELECT id FROM dead_letter_queue WHERE group_id = 'other'`), 10)
	poisoned.Store(false)
	c := e.client()
	c.signIn("ada", testToken)

	// One, from its page: replayed with the event parked behind it.
	r := c.post("/dead-letters/replay", url.Values{"id": {dl1}, "back": {"/dead-letters/" + dl1}}, true)
	if r.status != http.StatusSeeOther || !strings.HasPrefix(r.header.Get("Location"), "/dead-letters?done=") {
		t.Fatalf("replay: %d %s\n%s", r.status, r.header.Get("Location"), r.body)
	}
	if got := handledOffsets(t, e); got != "[7 1 3]" {
		t.Fatalf("handled %s after the replay of dead letter %s, want [7 1 3]", got, dl1)
	}
	// One discarded: its event is not handled, the parked one is.
	if r := c.post("/dead-letters/discard", url.Values{"id": {dl2}}, true); r.status != http.StatusSeeOther {
		t.Fatalf("discard: %d\n%s", r.status, r.body)
	}
	if got := handledOffsets(t, e); got != "[7 1 3 4]" {
		t.Fatalf("handled %s after the discard of dead letter %s, want [7 1 3 4]", got, dl2)
	}
	// Several at once, and one the console cannot replay.
	r = c.post("/dead-letters/replay", url.Values{"id": {dl5, dl6, other}}, true)
	if r.status != http.StatusSeeOther || !strings.Contains(c.mustGet(r.header.Get("Location")), "replay: 2 done, 1 failed") {
		t.Fatalf("bulk replay: %d %s, and its page does not say 2 done, 1 failed", r.status, r.header.Get("Location"))
	}
	if got := handledOffsets(t, e); got != "[7 1 3 4 5 6]" {
		t.Fatalf("handled %s after the bulk replay, want [7 1 3 4 5 6]", got)
	}
	if n := e.queryInt(`SELECT count(*) FROM dead_letter_queue`); n != 1 {
		t.Fatalf("%d dead letters left, want 1 (group other's)", n)
	}
	if n := e.queryInt(`SELECT count(*) FROM parked_events`) + e.queryInt(`SELECT count(*) FROM parked_hosts`); n != 0 {
		t.Fatalf("%d parked events and hosts left", n)
	}

	want := map[string]string{dl1: "replay ok: 2 events handled", dl2: "discard ok: 1 events handled", dl5: "replay ok: 1 events handled",
		dl6: "replay ok: 1 events handled", other: "replay failed: this console has no handlers for group \"other\""}
	for id, w := range want {
		var got string
		if err := e.pool.QueryRow(e.ctx, `SELECT action || ' ' || outcome FROM console_audit WHERE dead_letter_id = $1 AND actor = 'ada'`, id).Scan(&got); err != nil || !strings.HasPrefix(got, w) {
			t.Errorf("audit of dead letter %s: %q (%v), want %q…", id, got, err, w)
		}
	}
	page := c.mustGet("/dead-letters")
	if n := strings.Count(page, `class="audit-row"`); n != 5 {
		t.Errorf("the dead letters' page shows %d audit rows, want 5", n)
	}
	if n := strings.Count(e.logs.String(), `"message":"console action"`); n != 5 {
		t.Errorf("%d log lines of actions, want 5", n)
	}
}

// handledOffsets lists the handled offsets in handling order.
func handledOffsets(t *testing.T, e *env) string {
	t.Helper()
	rows, err := e.pool.Query(e.ctx, `SELECT c_offset FROM handled ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(got)
}
