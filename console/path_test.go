package console_test

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/internal/store"
)

// pathRow returns the row of group in a path table.
func pathRow(t *testing.T, body, group string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)<tr class="path-row" data-group="` + regexp.QuoteMeta(group) + `"[^>]*>(.*?)</tr>`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no row of group %s in\n%s", group, body)
	}
	return m[0]
}

// TestHostAndEventPaths: the host page and an event's page follow them
// through every group, each as the database says: a group that handled
// everything (and by when), one paused behind them (by exactly how many
// events), one halted before them, one whose copy of the event is
// dead-lettered, one where the host is parked behind a dead letter and
// whose owner's lease expired.
func TestHostAndEventPaths(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, console.Options{})
	const host = "tenant-42"
	for i := range 12 {
		e.appendTx(ev(fmt.Sprintf("other-%d", i%5), "t", `{}`))
		if i%3 == 1 {
			e.appendTx(ev(host, "order.placed", fmt.Sprintf(`{"n":%d}`, i)))
		}
	}
	var p int
	var first, mid, last int64
	var midID string
	if err := e.pool.QueryRow(e.ctx, `SELECT min(partition_id), min(c_offset), max(c_offset),
		(array_agg(c_offset ORDER BY c_offset))[2], (array_agg(event_id::text ORDER BY c_offset))[2]
		FROM outbox_message_t WHERE host_id = $1`, host).Scan(&p, &first, &last, &mid, &midID); err != nil {
		t.Fatal(err)
	}
	end := e.queryInt(`SELECT max(c_offset) + 1 FROM outbox_message_t WHERE partition_id = $1`, p)
	for _, g := range []string{"done", "paused", "halted", "parked", "dl"} {
		e.subscribe(g)
	}
	e.setPosition("done", p, end)
	e.exec(`UPDATE subscriptions SET state = 'PAUSED' WHERE group_id = 'paused'`)
	if err := store.Halt(e.ctx, e.pool, "halted", 1, p, first, "stuck on purpose"); err != nil {
		t.Fatal(err)
	}
	e.exec(`INSERT INTO consumer_replicas (group_id, topic_id, replica_id, mode, expires_at)
		VALUES ('halted', 1, 'r-live', 'auto', clock_timestamp() + interval '1 hour'),
		       ('parked', 1, 'r-old', 'auto', clock_timestamp() - interval '1 minute')`)
	e.exec(`UPDATE partition_leases SET owner = 'r-live', epoch = 3 WHERE group_id = 'halted' AND partition_id = $1`, p)
	e.exec(`UPDATE partition_leases SET owner = 'r-old', epoch = 2, expires_at = clock_timestamp() - interval '1 minute'
		WHERE group_id = 'parked' AND partition_id = $1`, p)
	var parkDL, dlDL int64
	for _, x := range []struct {
		group  string
		id     *int64
		offset int64
	}{{"parked", &parkDL, first}, {"dl", &dlDL, mid}} {
		if err := e.pool.QueryRow(e.ctx, `INSERT INTO dead_letter_queue (group_id, topic_id, partition_id, first_offset, last_offset,
			transaction_id, event_ids, host_ids, events, error, attempts, first_failed_at, last_failed_at, parked_hosts)
			SELECT $1, 1, m.partition_id, m.c_offset, m.c_offset, m.transaction_id, ARRAY[m.event_id], ARRAY[m.host_id],
			       jsonb_build_array(to_jsonb(m)), 'nope', 1, now(), now(), $1 = 'parked'
			FROM outbox_message_t m WHERE m.c_offset = $2 AND m.partition_id = $3 RETURNING id`, x.group, x.offset, p).Scan(x.id); err != nil {
			t.Fatal(err)
		}
	}
	e.setPosition("dl", p, mid+1)
	e.exec(`INSERT INTO parked_hosts (group_id, topic_id, partition_id, host_id, dead_letter_id) VALUES ('parked', 1, $1, $2, $3)`, p, host, parkDL)
	before := func(group string, offset int64) int64 {
		pos := e.positions(group)[p]
		return e.queryInt(`SELECT count(*) FROM outbox_message_t WHERE partition_id = $1 AND c_offset >= $2 AND c_offset < $3`, p, pos, offset)
	}

	c := e.client()
	hostPage := c.mustGet("/topics/1/hosts?host=" + url.QueryEscape(host))
	for group, wants := range map[string][]string{
		"done":   {`data-waiting="false"`, fmt.Sprintf(">%d</a>, created", last), "handled by", `class="next">nothing`},
		"paused": {`data-waiting="true"`, fmt.Sprintf(">%d</a>, %d events before it", first, before("paused", first)), "the group is PAUSED", "no replica owns the partition"},
		"halted": {`data-waiting="true"`, fmt.Sprintf("the partition is halted at offset %d", first), "stuck on purpose"},
		"parked": {fmt.Sprintf("the host is parked behind dead letter %d", parkDL), "the lease of r-old expired at", fmt.Sprintf(`href="/dead-letters/%d"`, parkDL)},
		"dl":     {fmt.Sprintf(`href="/dead-letters/%d"`, dlDL), fmt.Sprintf(">%d</a>, created", mid)},
	} {
		row := pathRow(t, hostPage, group)
		for _, w := range wants {
			if !strings.Contains(row, w) {
				t.Errorf("host page, group %s: no %q in %s", group, w, row)
			}
		}
	}
	if strings.Contains(pathRow(t, hostPage, "halted"), "no replica owns") || strings.Contains(pathRow(t, hostPage, "halted"), "PAUSED") {
		t.Error("host page: the halted group, owned and ACTIVE, is said to be blocked by something else")
	}

	eventPage := c.mustGet(fmt.Sprintf("/topics/1/partitions/%d/offsets/%d", p, mid))
	if !strings.Contains(eventPage, midID) {
		t.Fatal("the event page does not show the event's id")
	}
	for group, wants := range map[string][]string{
		"done":   {`data-status="handled"`, "handled by"},
		"paused": {`data-status="pending"`, fmt.Sprintf("%d events before it", before("paused", mid)), "the group is PAUSED"},
		"halted": {`data-status="pending"`, fmt.Sprintf("the partition is halted at offset %d", first)},
		"parked": {`data-status="pending"`, fmt.Sprintf("the host is parked behind dead letter %d", parkDL)},
		"dl":     {`data-status="dead-lettered"`, fmt.Sprintf(`href="/dead-letters/%d"`, dlDL)},
	} {
		row := pathRow(t, eventPage, group)
		for _, w := range wants {
			if !strings.Contains(row, w) {
				t.Errorf("event page, group %s: no %q in %s", group, w, row)
			}
		}
	}
}
