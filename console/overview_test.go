package console_test

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/internal/human"
	"github.com/pgevents/pgevents/schema"
)

// groupRow returns the overview's row of group.
func groupRow(t *testing.T, body, group string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr class="group-row" data-group="` + regexp.QuoteMeta(group) + `">(.*?)</tr>`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no row of group %s in\n%s", group, body)
	}
	return m[1]
}

// TestOverviewAndReplicas: the overview shows each group's lag as the
// database counts it, the partitions its live replicas own, and the rate
// of the samples once two of them count events handled; the replicas page
// shows the running replica with its partitions and a fresh heartbeat.
func TestOverviewAndReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, console.Options{})
	var poisoned atomic.Bool
	cons, _ := e.startGroup(2, pgevents.PolicyDeadLetter, &poisoned)
	for i := range 20 {
		e.appendTx(ev(fmt.Sprintf("h%d", i%7), "t", `{}`))
	}
	waitFor(t, "20 handled", func() bool { return e.handled() == 20 })
	e.subscribe("idle")
	e.setPosition("idle", 0, e.queryInt(`SELECT coalesce(max(c_offset), 0) FROM outbox_message_t WHERE partition_id = 0`)) // one left there
	c := e.client()
	body := c.mustGet("/")
	lag := e.queryInt(`SELECT count(*) FROM outbox_message_t m JOIN consumer_offsets o ON o.partition_id = m.partition_id
		WHERE o.group_id = 'idle' AND m.c_offset >= o.next_offset`)
	if row := groupRow(t, body, "idle"); !strings.Contains(row, fmt.Sprintf(`class="num lag">%d<`, lag)) || !strings.Contains(row, ">0/2<") {
		t.Errorf("group idle: want lag %d and no partition owned in %s", lag, row)
	}
	// The replica's leases are live while its heartbeat is on time, which a
	// loaded machine may delay: the page says so as the database does.
	waitFor(t, "group g with lag 0 and its 2 partitions owned", func() bool {
		row := groupRow(t, c.mustGet("/"), "g")
		return strings.Contains(row, `class="num lag">0<`) && strings.Contains(row, ">2/2<")
	})

	// Two samples around 30 events handled make a rate: the page's is the
	// newest sample's events over its seconds, and the samples since the
	// first count the 30 events (the consumer's own maintenance may
	// sample meanwhile: their sum counts them all the same).
	first := e.sample()
	for i := range 30 {
		e.appendTx(ev(fmt.Sprintf("h%d", i%7), "t", `{}`))
	}
	waitFor(t, "50 handled", func() bool { return e.handled() == 50 })
	e.sample()
	if n := e.queryInt(`SELECT sum(handled) FROM group_samples WHERE group_id = 'g' AND taken_at > $1`, first.At); n != 30 {
		t.Errorf("the samples since the first count %d events handled, want 30", n)
	}
	waitFor(t, "the overview's rate is the newest sample's", func() bool {
		row := groupRow(t, c.mustGet("/"), "g")
		var handled int64
		var seconds float64
		if err := e.pool.QueryRow(e.ctx, `SELECT handled, seconds FROM group_samples WHERE group_id = 'g' ORDER BY bucket DESC LIMIT 1`).Scan(&handled, &seconds); err != nil {
			t.Fatal(err)
		}
		return strings.Contains(row, `">`+human.Rate(float64(handled)/seconds)+`</td>`) && strings.Contains(row, `class="num rate" title="`+human.Count(handled)+` events in the`)
	})

	replicas := c.mustGet("/replicas")
	m := regexp.MustCompile(`(?s)<tr class="replica" data-replica="` + cons.ReplicaID() + `" data-live-replica="true">(.*?)</tr>`).FindStringSubmatch(replicas)
	if m == nil {
		t.Fatalf("the replicas page does not show %s as live:\n%s", cons.ReplicaID(), replicas)
	}
	if !strings.Contains(m[1], `class="partitions">0, 1<`) {
		t.Errorf("replica %s: want partitions 0, 1 in %s", cons.ReplicaID(), m[1])
	}
	if age := find(t, m[1], `class="num age">([^<]+)<`); !regexp.MustCompile(`^(\d+ ms|[0-4](\.\d)? s)$`).MatchString(age) {
		t.Errorf("replica %s: heartbeat age %s, want under 5 s", cons.ReplicaID(), age)
	}
}

// TestOverviewShowsTheSequencer: a sequenced topic whose producers
// committed events that no process sequences: the overview says that no
// process sequences it and how many events wait staged; the topic that is
// not sequenced shows no sequencer. Once a session holds the sequencer key
// it is named, and once a tick moved the events nothing staged waits.
func TestOverviewShowsTheSequencer(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, console.Options{})
	if _, _, err := schema.EnsureTopicSpec(e.ctx, e.pool, schema.TopicSpec{ID: 2, Partitions: 2, Scope: schema.ScopeSequenced}); err != nil {
		t.Fatal(err)
	}
	for i := range 7 {
		e.exec(`SELECT append_event(2, $1, '', 't', '{}')`, fmt.Sprintf("h%d", i))
	}
	c := e.client()
	section := func(topic int) string {
		t.Helper()
		return find(t, c.mustGet("/"), `(?s)<section class="topic" id="topic-`+strconv.Itoa(topic)+`">(.*?)</section>`)
	}
	if s := section(1); strings.Contains(s, "sequencer") {
		t.Errorf("topic 1, not sequenced, shows a sequencer:\n%s", s)
	}
	if s := section(2); !strings.Contains(s, "none: no process sequences the topic") || !strings.Contains(s, `<span class="bad staged">7 staged, not sequenced`) {
		t.Errorf("topic 2 does not show that nothing sequences its 7 staged events:\n%s", s)
	}
	conn, err := e.pool.Acquire(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	defer conn.Conn().Close(e.ctx) //nolint:errcheck // the session holds the key: not given back to the pool
	if _, err := conn.Exec(e.ctx, `SELECT set_config('application_name', 'pgevents sequencer maintain', false), pg_advisory_lock(lock_key('sequencer', '2'))`); err != nil {
		t.Fatal(err)
	}
	if s := section(2); !strings.Contains(s, `<dd class="sequencer">pgevents sequencer maintain</dd>`) {
		t.Errorf("topic 2 does not name the session holding the sequencer key:\n%s", s)
	}
	if _, err := conn.Exec(e.ctx, `SELECT sequence_tick(2)`); err != nil {
		t.Fatal(err)
	}
	if s := section(2); !strings.Contains(s, `<span class="staged">nothing staged waits</span>`) {
		t.Errorf("topic 2 still shows staged events after a tick:\n%s", s)
	}
}
