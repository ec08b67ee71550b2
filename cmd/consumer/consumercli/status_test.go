package consumercli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
)

// statusFixture prepares a 4-partition topic with events, group g at
// various positions in every partition (one halted, one with open dead
// letters), and group h with a position in partition 2 only. It returns the
// database URL, a pool and the configuration file.
func statusFixture(t *testing.T) (string, *pgxpool.Pool, string) {
	t.Helper()
	url, pool := migrated(t, 4)
	ctx := context.Background()
	if err := store.Init(ctx, pool, "g", 1, []int{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := store.Init(ctx, pool, "h", 1, []int{2}); err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var evs []pgevents.Event
			for k := range 1 + i%4 {
				evs = append(evs, pgevents.Event{HostID: fmt.Sprintf("host-%d", (i*3+k)%9), EventType: "t", Payload: []byte(`{}`)})
			}
			_, err := pgevents.Append(ctx, tx, evs...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Group g has handled everything in partition 1, half of partition 0.
	eventtest.Exec(t, pool, `UPDATE consumer_offsets o SET next_offset = (SELECT max(c_offset) + 1 FROM outbox_message_t
		WHERE partition_id = 1) WHERE group_id = 'g' AND partition_id = 1`)
	eventtest.Exec(t, pool, `UPDATE consumer_offsets o SET next_offset = (SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY c_offset)
		FROM outbox_message_t WHERE partition_id = 0) WHERE group_id = 'g' AND partition_id = 0`)
	for range 2 {
		eventtest.Exec(t, pool, `INSERT INTO dead_letter_queue (group_id, topic_id, partition_id, first_offset, last_offset,
			transaction_id, event_ids, host_ids, events, error, attempts, first_failed_at, last_failed_at)
			VALUES ('g', 1, 3, 1, 1, 1, '{}', '{}', '[]', 'boom', 1, now(), now())`)
	}
	if err := store.Halt(ctx, pool, "g", 1, 2, 7, "handler failed:\n  the reason is long, and spans lines"); err != nil {
		t.Fatal(err)
	}
	return url, pool, writeConfig(t, recordingConfig(4, -1, 10))
}

// wantStatus computes, with plain SQL, what status must say about a group
// in a partition.
func wantStatus(t *testing.T, pool *pgxpool.Pool, group string, p int) partitionStatus {
	t.Helper()
	ctx := context.Background()
	ps := partitionStatus{GroupID: group, PartitionID: p}
	var next, logEnd *int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT next_offset FROM consumer_offsets WHERE group_id = $1 AND partition_id = $2),
		(SELECT max(c_offset) FROM outbox_message_t WHERE partition_id = $2)`, group, p).Scan(&next, &logEnd); err != nil {
		t.Fatal(err)
	}
	ps.NextOffset, ps.LogEnd = next, logEnd
	if next != nil {
		ps.LagEvents = eventtest.QueryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE partition_id = $1 AND c_offset >= $2`, p, *next)
	}
	ps.DeadLettersOpen = eventtest.QueryInt(t, pool, `SELECT count(*) FROM dead_letter_queue WHERE group_id = $1 AND partition_id = $2`, group, p)
	var h haltStatus
	err := pool.QueryRow(ctx, `SELECT c_offset, reason, halted_at FROM partition_halts WHERE group_id = $1 AND partition_id = $2`,
		group, p).Scan(&h.Offset, &h.Reason, &h.Since)
	if err == nil {
		ps.Halted = &h
	} else if err != pgx.ErrNoRows {
		t.Fatal(err)
	}
	return ps
}

func TestStatusJSONMatchesDatabase(t *testing.T) {
	t.Parallel()
	url, pool, cfg := statusFixture(t)
	code, out := runOnce(t, url, "status", "--config", cfg, "--json")
	if code != 0 {
		t.Fatalf("status --json: exit %d\n%s", code, out)
	}
	var doc statusJSON
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("status --json is not JSON: %v\n%s", err, out)
	}
	if doc.TopicID != 1 || doc.TotalPartitions != 4 || doc.LagCap <= 0 || doc.DatabaseTime.IsZero() {
		t.Fatalf("header fields: %+v", doc)
	}
	if len(doc.Partitions) != 8 {
		t.Fatalf("%d rows, want 8 (groups g and h × 4 partitions)\n%s", len(doc.Partitions), out)
	}
	lagging := 0
	for i, got := range doc.Partitions {
		wantGroup, wantPart := "g", i
		if i >= 4 {
			wantGroup, wantPart = "h", i-4
		}
		want := wantStatus(t, pool, wantGroup, wantPart)
		if got.GroupID != want.GroupID || got.PartitionID != want.PartitionID ||
			!eqPtr(got.NextOffset, want.NextOffset) || !eqPtr(got.LogEnd, want.LogEnd) ||
			got.LagEvents != want.LagEvents || got.LagCapped || got.DeadLettersOpen != want.DeadLettersOpen ||
			(got.Halted == nil) != (want.Halted == nil) ||
			got.Halted != nil && (got.Halted.Offset != want.Halted.Offset || got.Halted.Reason != want.Halted.Reason) {
			t.Errorf("row %d:\n got %s\nwant %s", i, dump(got), dump(want))
		}
		switch {
		case want.LagEvents > 0 && (got.LagSeconds <= 0 || got.LagSeconds > 600):
			t.Errorf("row %d: %d events behind, lag_seconds %v", i, want.LagEvents, got.LagSeconds)
		case want.LagEvents == 0 && got.LagSeconds != 0:
			t.Errorf("row %d: caught up, lag_seconds %v", i, got.LagSeconds)
		}
		if want.LagEvents > 0 {
			lagging++
		}
	}
	if lagging < 3 {
		t.Fatalf("only %d rows lag; the fixture proves little", lagging)
	}
	// The reserved fields are present, as null.
	for _, key := range []string{`"lease": null`, `"subscription": null`, `"halted": {`, `"next_offset": null`} {
		if !strings.Contains(out, key) {
			t.Errorf("output lacks %s", key)
		}
	}

	// --group selects one group.
	code, out = runOnce(t, url, "status", "--config", cfg, "--json", "--group", "h")
	if code != 0 {
		t.Fatalf("status --json --group h: exit %d\n%s", code, out)
	}
	doc = statusJSON{}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Partitions) != 4 {
		t.Fatalf("--group h: %d rows, want 4", len(doc.Partitions))
	}
	for _, p := range doc.Partitions {
		if p.GroupID != "h" || (p.NextOffset != nil) != (p.PartitionID == 2) {
			t.Errorf("--group h: row %s", dump(p))
		}
	}
}

func eqPtr(a, b *int64) bool { return a == nil && b == nil || a != nil && b != nil && *a == *b }

func dump(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestStatusTable(t *testing.T) {
	t.Parallel()
	url, pool, cfg := statusFixture(t)
	code, out := runOnce(t, url, "status", "--config", cfg)
	if code != 0 {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	header := lines[0]
	for _, col := range []string{"GROUP", "PARTITION", "NEXT OFFSET", "LOG END", "LAG", "LAG AGE", "DEAD LETTERS", "HALTED"} {
		if !strings.Contains(header, col) {
			t.Fatalf("header %q lacks %s\n%s", header, col, out)
		}
	}
	if strings.Contains(header, "OWNER") || strings.Contains(header, "SUBSCRIPTION") {
		t.Errorf("empty placeholder columns shown: %q", header)
	}
	var rows []string
	for _, l := range lines[1:] {
		if l == "" {
			break
		}
		rows = append(rows, l)
	}
	if len(rows) != 8 {
		t.Fatalf("%d rows, want 8:\n%s", len(rows), out)
	}
	// Columns are aligned: each header starts where each row's cell starts.
	starts := columnStarts(header)
	if len(starts) != 8 {
		t.Fatalf("header %q: %d columns", header, len(starts))
	}
	for _, r := range rows {
		rr := []rune(r)
		for i, s := range starts[1:] {
			if s >= len(rr) || rr[s] == ' ' || rr[s-1] != ' ' || rr[s-2] != ' ' {
				t.Fatalf("row not aligned with column %d of the header:\n%s\n%s", i+1, header, r)
			}
		}
		if utf8.RuneCountInString(r) < starts[len(starts)-1] {
			t.Fatalf("short row %q", r)
		}
	}
	// Rows say what the database says.
	want := map[string]bool{
		"g  0": true, "h  2": true,
	}
	for _, r := range rows {
		f := strings.Fields(r)
		key := f[0] + "  " + f[1]
		ws := wantStatus(t, pool, f[0], atoi(t, f[1]))
		if f[2] != optInt(ws.NextOffset) || f[3] != optInt(ws.LogEnd) {
			t.Errorf("row %q: want next offset %s, log end %s", r, optInt(ws.NextOffset), optInt(ws.LogEnd))
		}
		if ws.NextOffset != nil && f[4] != fmt.Sprint(ws.LagEvents) {
			t.Errorf("row %q: want lag %d", r, ws.LagEvents)
		}
		halted := ws.Halted != nil
		if strings.Contains(r, "at 7: handler failed: the reason is long") != halted {
			t.Errorf("row %q: halted %v", r, halted)
		}
		delete(want, key)
	}
	if len(want) != 0 {
		t.Errorf("rows missing: %v", want)
	}
	if !strings.Contains(out, "topic 1: 4 partitions; notification queue usage") {
		t.Errorf("summary line missing:\n%s", out)
	}
	t.Logf("consumer status:\n%s", out)
}

// columnStarts returns the rune index at which each column of a header
// made by tabwriter (padding 2) starts. Headers hold single spaces inside
// them, columns are separated by two or more.
func columnStarts(header string) []int {
	r := []rune(header)
	starts := []int{0}
	for i := 2; i < len(r); i++ {
		if r[i] != ' ' && r[i-1] == ' ' && r[i-2] == ' ' {
			starts = append(starts, i)
		}
	}
	return starts
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

func TestStatusWatch(t *testing.T) {
	t.Parallel()
	url, _, cfg := statusFixture(t)
	p := start(t, url, "status", "--config", cfg, "--watch", "--interval", "100ms")
	pgtest.WaitFor(t, 20*time.Second, "three refreshes", func() bool {
		return strings.Count(p.out.String(), ansiHomeClear) >= 3
	})
	if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-p.exitCh:
		if code != 0 {
			t.Fatalf("status --watch exited %d after SIGINT, want 0\n%s", code, p.out.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("status --watch did not exit within 10 s of SIGINT")
	}
	screens := strings.Split(p.out.String(), ansiHomeClear)
	last := screens[len(screens)-1]
	if !strings.Contains(last, "GROUP") || !strings.Contains(last, "consumer status, every 100ms") {
		t.Fatalf("last screen:\n%s", last)
	}
}

func TestStatusUsage(t *testing.T) {
	t.Parallel()
	url, _, cfg := statusFixture(t)
	for _, args := range [][]string{{"--interval", "0s", "--watch"}, {"extra"}, {"--nope"}} {
		code, out := runOnce(t, url, append([]string{"status", "--config", cfg}, args...)...)
		if code != 2 {
			t.Errorf("status %v: exit %d, want 2\n%s", args, code, out)
		}
	}
	code, out := runOnce(t, url, "status", "-h")
	if code != 0 || !strings.Contains(out, "lag_seconds") || !strings.Contains(out, "--watch") {
		t.Errorf("status -h: exit %d\n%s", code, out)
	}
}

// TestStatusShowsTheSequencer: a sequenced topic whose producers committed
// 325 events while no process sequenced them. `consumer status` says so:
// no sequencer, 325 events staged (with their age), and each partition's
// lag counts the events staged for it, with their age (it said LAG 0).
// Once a session holds the sequencer key it is named, and once a tick
// moved the events into the log nothing is staged, the last tick is
// recent, and the lag is the same events, now in the log.
func TestStatusShowsTheSequencer(t *testing.T) {
	t.Parallel()
	f := newSequencedFixture(t)
	ctx := context.Background()
	if err := store.Init(ctx, f.pool, "g", 1, []int{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	for i := range 65 {
		f.appendTx(t, i, 5)
	}
	type doc struct {
		Sequencer *struct {
			Session         string  `json:"session"`
			Waiting         int     `json:"waiting"`
			LastTickSeconds float64 `json:"last_tick_seconds"`
			StagedEvents    int64   `json:"staged_events"`
			StagedCapped    bool    `json:"staged_capped"`
			StagedSeconds   float64 `json:"staged_seconds"`
		} `json:"sequencer"`
		Partitions []struct {
			PartitionID int     `json:"partition_id"`
			LagEvents   int64   `json:"lag_events"`
			LagSeconds  float64 `json:"lag_seconds"`
		} `json:"partitions"`
	}
	status := func() (doc, string) {
		t.Helper()
		code, out := runOnce(t, f.url, "status", "--config", f.cfg, "--json")
		var d doc
		if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil {
			t.Fatalf("status --json: exit %d, %v\n%s", code, err, out)
		}
		code, text := runOnce(t, f.url, "status", "--config", f.cfg)
		if code != 0 {
			t.Fatalf("status: exit %d\n%s", code, text)
		}
		return d, text
	}
	// Each partition's lag: the events staged for it (none is in the log).
	checkLag := func(d doc, out string) {
		t.Helper()
		if len(d.Partitions) != 4 {
			t.Fatalf("%d partitions in status, want 4", len(d.Partitions))
		}
		for _, p := range d.Partitions {
			want := eventtest.QueryInt(t, f.pool, `SELECT count(*) FROM staged_events WHERE event_partition(host_id, 4) = $1`, p.PartitionID)
			if p.LagEvents != want || want > 0 && p.LagSeconds <= 0 {
				t.Errorf("partition %d: lag %d events, %.3fs; want %d events, a positive age\n%s", p.PartitionID, p.LagEvents, p.LagSeconds, want, out)
			}
		}
	}
	d, text := status()
	if sq := d.Sequencer; sq == nil || sq.Session != "" || sq.StagedEvents != 325 || sq.StagedCapped || sq.StagedSeconds <= 0 {
		t.Fatalf("sequencer %+v, want none holding the key and 325 staged events with an age\n%s", d.Sequencer, text)
	}
	if !strings.Contains(text, "sequencer: none (no process sequences the topic") || !strings.Contains(text, "325 events staged, not sequenced") {
		t.Errorf("status does not say that nothing sequences the 325 staged events:\n%s", text)
	}
	checkLag(d, text)

	// A sequencer (as consumer maintain's session is named) takes the key,
	// and ticks.
	cfg, err := pgx.ParseConfig(f.url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "pgevents sequencer maintain"
	seq, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Close(ctx)
	if _, err := seq.Exec(ctx, `SELECT pg_advisory_lock(lock_key('sequencer', '1'))`); err != nil {
		t.Fatal(err)
	}
	if d, text = status(); d.Sequencer == nil || d.Sequencer.Session != "pgevents sequencer maintain" || d.Sequencer.StagedEvents != 325 {
		t.Fatalf("sequencer %+v, want the key's holder named and 325 staged\n%s", d.Sequencer, text)
	}
	var moved int
	if err := seq.QueryRow(ctx, `SELECT sequence_tick(1)`).Scan(&moved); err != nil || moved != 325 {
		t.Fatalf("tick: %d events, %v", moved, err)
	}
	d, text = status()
	if sq := d.Sequencer; sq == nil || sq.StagedEvents != 0 || sq.LastTickSeconds > 10 {
		t.Fatalf("sequencer %+v after a tick, want nothing staged and a recent tick\n%s", d.Sequencer, text)
	}
	var lag int64
	for _, p := range d.Partitions {
		lag += p.LagEvents
		if want := eventtest.QueryInt(t, f.pool, `SELECT count(*) FROM outbox_message_t WHERE partition_id = $1`, p.PartitionID); p.LagEvents != want {
			t.Errorf("partition %d: lag %d after the tick, want the %d events now in the log", p.PartitionID, p.LagEvents, want)
		}
	}
	if lag != 325 {
		t.Errorf("lag %d after the tick, want 325", lag)
	}
}
