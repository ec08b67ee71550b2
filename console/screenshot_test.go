package console_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/internal/store"
)

// EnvREADMEShots names a directory where TestREADMEScreenshots writes the
// README's screenshots (console.png, console-group.png); the test skips
// without it, so that no test run writes into the repository by itself.
// Regenerate them with:
//
//	PGEVENTS_README_SHOTS=$PWD/docs go test -p 1 -count=1 -run TestREADMEScreenshots ./console/
const EnvREADMEShots = "PGEVENTS_README_SHOTS"

// TestREADMEScreenshots takes the README's screenshots of the overview and
// a group page, on a small demo: an orders topic of 4 partitions with
// events of a few dozen hosts, a group caught up, one behind, one paused,
// one halted on a dead letter with its host parked, and live replicas.
func TestREADMEScreenshots(t *testing.T) {
	dir := os.Getenv(EnvREADMEShots)
	if dir == "" {
		t.Skipf("set %s to a directory to write the README's screenshots", EnvREADMEShots)
	}
	e := newEnv(t, 4, console.Options{ReadOnly: true})
	types := []string{"order.created", "order.paid", "order.shipped", "invoice.sent"}
	for i := range 240 {
		e.appendTx(ev(fmt.Sprintf("customer-%d", i%37), types[i%len(types)],
			fmt.Sprintf(`{"order":%d,"amount":%d.%02d,"currency":"EUR"}`, 1000+i, 10+i%90, i%100)))
	}
	for _, g := range []string{"billing", "emails", "analytics", "search-index"} {
		e.subscribe(g)
	}
	// billing caught up; emails behind; analytics paused further behind;
	// search-index halted on a dead letter in partition 2.
	e.exec(`UPDATE consumer_offsets o SET next_offset = coalesce((SELECT max(m.c_offset) + 1 FROM outbox_message_t m
		WHERE m.topic_id = 1 AND m.partition_id = o.partition_id), 1) WHERE o.group_id = 'billing'`)
	e.exec(`UPDATE consumer_offsets o SET next_offset = coalesce((SELECT max(m.c_offset) - 14 FROM outbox_message_t m
		WHERE m.topic_id = 1 AND m.partition_id = o.partition_id), 1) WHERE o.group_id = 'emails'`)
	e.exec(`UPDATE consumer_offsets o SET next_offset = 120 WHERE o.group_id = 'analytics'`)
	e.exec(`UPDATE consumer_offsets o SET next_offset = coalesce((SELECT max(m.c_offset) - 3 FROM outbox_message_t m
		WHERE m.topic_id = 1 AND m.partition_id = o.partition_id), 1) WHERE o.group_id = 'search-index'`)
	e.exec(`UPDATE subscriptions SET state = 'PAUSED' WHERE group_id = 'analytics'`)
	var p int
	var off int64
	if err := e.pool.QueryRow(e.ctx, `SELECT partition_id, c_offset FROM outbox_message_t WHERE partition_id = 2 ORDER BY c_offset DESC OFFSET 20 LIMIT 1`).Scan(&p, &off); err != nil {
		t.Fatal(err)
	}
	if err := store.Halt(e.ctx, e.pool, "search-index", 1, p, off, "permanent: mapping for field \"amount\" rejects the value"); err != nil {
		t.Fatal(err)
	}
	var dl int64
	if err := e.pool.QueryRow(e.ctx, `INSERT INTO dead_letter_queue (group_id, topic_id, partition_id, first_offset, last_offset,
		transaction_id, event_ids, host_ids, events, error, attempts, first_failed_at, last_failed_at, parked_hosts)
		SELECT 'emails', 1, m.partition_id, m.c_offset, m.c_offset, m.transaction_id, ARRAY[m.event_id], ARRAY[m.host_id],
		       jsonb_build_array(to_jsonb(m)), 'permanent: mail server rejected the address', 3, now(), now(), true
		FROM outbox_message_t m WHERE m.partition_id = 1 ORDER BY m.c_offset DESC OFFSET 30 LIMIT 1
		RETURNING id`).Scan(&dl); err != nil {
		t.Fatal(err)
	}
	e.exec(`INSERT INTO parked_hosts (group_id, topic_id, partition_id, host_id, dead_letter_id)
		SELECT group_id, topic_id, partition_id, host_ids[1], id FROM dead_letter_queue WHERE id = $1`, dl)
	for _, r := range []struct {
		group, replica string
		parts          []int32
	}{{"billing", "billing-7f9c", []int32{0, 1}}, {"billing", "billing-2ab1", []int32{2, 3}},
		{"emails", "emails-5d10", []int32{0, 1, 2, 3}}, {"search-index", "search-91ee", []int32{0, 1, 2, 3}}} {
		e.exec(`INSERT INTO consumer_replicas (group_id, topic_id, replica_id, mode, hostname, pid, expires_at)
			VALUES ($1, 1, $2, 'auto', 'app-' || $2, 4242, clock_timestamp() + interval '1 hour')`, r.group, r.replica)
		e.exec(`UPDATE partition_leases SET owner = $2, epoch = epoch + 1, acquired_at = clock_timestamp(),
			heartbeat_at = clock_timestamp(), expires_at = clock_timestamp() + interval '1 hour'
			WHERE group_id = $1 AND partition_id = ANY ($3::integer[])`, r.group, r.replica, r.parts)
	}
	ctx := browser(t)
	for _, s := range []struct{ file, path, ready string }{
		{"console.png", "/", `#overview`},
		{"console-group.png", "/topics/1/groups/emails", `#group-lag`},
	} {
		if err := chromedp.Do(ctx, chromedp.EmulateViewport(1200, 760), chromedp.Navigate(e.srv.URL+s.path),
			chromedp.WaitVisible(chromedp.CSS(s.ready))); err != nil {
			t.Fatalf("%s: %v", s.path, err)
		}
		buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("%s: %v", s.path, err)
		}
		if err := os.WriteFile(filepath.Join(dir, s.file), buf, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d KB)", filepath.Join(dir, s.file), len(buf)/1024)
	}
}
