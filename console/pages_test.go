package console_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/internal/store"
)

// fixture fills env's topic with a bit of everything the pages show:
// events of six hosts, group g with positions half-way (a halt in
// partition 0, a dead letter and a parked host), group h paused at the
// start, and a live replica of g owning partition 1. It returns the
// dead letter's id.
func (e *env) fixture() int64 {
	e.t.Helper()
	for i := range 30 {
		e.appendTx(ev(fmt.Sprintf("host-%d", i%6), fmt.Sprintf("type.%d", i%3), fmt.Sprintf(`{"i":%d}`, i)))
	}
	e.subscribe("g")
	e.subscribe("h")
	e.exec(`UPDATE subscriptions SET state = 'PAUSED' WHERE group_id = 'h'`)
	e.exec(`UPDATE consumer_offsets SET next_offset = next_offset + 3 WHERE group_id = 'g'`)
	if err := store.Halt(e.ctx, e.pool, "g", 1, 0, 7, "handler said no"); err != nil {
		e.t.Fatal(err)
	}
	var dl int64
	if err := e.pool.QueryRow(e.ctx, `INSERT INTO dead_letter_queue (group_id, topic_id, partition_id, first_offset, last_offset,
		transaction_id, event_ids, host_ids, events, error, attempts, first_failed_at, last_failed_at, parked_hosts)
		SELECT 'g', 1, m.partition_id, m.c_offset, m.c_offset, m.transaction_id, ARRAY[m.event_id], ARRAY[m.host_id],
		       jsonb_build_array(to_jsonb(m)), 'permanent: bad payload', 3, now(), now(), true
		FROM outbox_message_t m WHERE m.host_id = 'host-2' ORDER BY m.c_offset LIMIT 1
		RETURNING id`).Scan(&dl); err != nil {
		e.t.Fatal(err)
	}
	e.exec(`INSERT INTO parked_hosts (group_id, topic_id, partition_id, host_id, dead_letter_id)
		SELECT 'g', 1, partition_id, 'host-2', $1 FROM dead_letter_queue WHERE id = $1`, dl)
	e.exec(`INSERT INTO consumer_replicas (group_id, topic_id, replica_id, mode, hostname, pid, expires_at)
		VALUES ('g', 1, 'replica-a', 'auto', 'box-1', 42, clock_timestamp() + interval '1 hour')`)
	e.exec(`UPDATE partition_leases SET owner = 'replica-a', epoch = epoch + 1 WHERE group_id = 'g' AND partition_id = 1`)
	return dl
}

// TestEveryPageRenders: every page answers 200 with what it is about, for
// a reader and for a signed-in operator, and a page that does not exist
// answers 404.
func TestEveryPageRenders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4, console.Options{})
	dl := e.fixture()
	var p, o int64
	if err := e.pool.QueryRow(e.ctx, `SELECT partition_id, c_offset FROM outbox_message_t WHERE host_id = 'host-3' ORDER BY c_offset LIMIT 1`).Scan(&p, &o); err != nil {
		t.Fatal(err)
	}
	pages := map[string][]string{
		"/":                                   {"Topic 1", `data-group="g"`, `data-group="h"`, "PAUSED"},
		"/topics/1/groups/g":                  {"replica-a", "handler said no", "host-2"},
		"/topics/1/events":                    {"host-5", "type.2"},
		"/topics/1/events?partition=1&from=1": {"Oldest first"},
		fmt.Sprintf("/topics/1/partitions/%d/offsets/%d", p, o): {"host-3", `data-group="g"`, `data-group="h"`},
		"/topics/1/hosts?host=host-2":                           {`data-group="g"`, "parked behind dead letter"},
		"/dead-letters":                                         {"permanent: bad payload"},
		fmt.Sprintf("/dead-letters/%d", dl):                     {"permanent: bad payload", "host-2"},
		"/replicas":                                             {"replica-a", "box-1"},
		"/audit":                                                {"nothing yet"},
		"/signin":                                               {"Sign in"},
	}
	reader, operator := e.client(), e.client()
	operator.signIn("ada", testToken)
	for path, wants := range pages {
		for _, c := range []*client{reader, operator} {
			body := c.mustGet(path)
			for _, w := range wants {
				if !strings.Contains(body, w) {
					t.Errorf("GET %s: no %q in the page", path, w)
				}
			}
		}
	}
	for _, path := range []string{"/nothing", "/topics/1/groups/nobody", "/dead-letters/999999", "/topics/9/events"} {
		if r := reader.get(path); r.status != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, r.status)
		}
	}
}
