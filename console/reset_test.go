package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/internal/human"
)

// move is a row of the reset confirmation.
type move struct {
	partition              int
	from, to, replay, skip int64
}

var moveRow = regexp.MustCompile(`<tr class="move" data-partition="(\d+)"><td class="num">\d+</td><td class="num">(-|\d+)</td><td class="num to">(\d+)</td>\s*<td class="num replay">([\d,]+)</td><td class="num skip">([\d,]+)</td></tr>`)

// parseMoves reads the confirmation's rows and its hidden expect field.
func parseMoves(t *testing.T, body string) ([]move, string) {
	t.Helper()
	var out []move
	for _, m := range moveRow.FindAllStringSubmatch(body, -1) {
		var mv move
		mv.partition, _ = strconv.Atoi(m[1])
		mv.from = -1
		if m[2] != "-" {
			mv.from, _ = strconv.ParseInt(m[2], 10, 64)
		}
		mv.to, _ = strconv.ParseInt(m[3], 10, 64)
		mv.replay, _ = strconv.ParseInt(strings.ReplaceAll(m[4], ",", ""), 10, 64)
		mv.skip, _ = strconv.ParseInt(strings.ReplaceAll(m[5], ",", ""), 10, 64)
		out = append(out, mv)
	}
	if len(out) == 0 {
		t.Fatalf("no move in the confirmation:\n%s", body)
	}
	return out, find(t, body, `name="expect" value="([^"]*)"`)
}

// checkPreview compares a confirmation with the database: each
// partition's "position now" is the group's position, and the events it
// says the reset replays or skips are those the database holds between
// the two positions.
func (e *env) checkPreview(what string, moves []move, body string) {
	e.t.Helper()
	pos := e.positions("g")
	var replay, skip int64
	for _, m := range moves {
		if m.from != pos[m.partition] {
			e.t.Errorf("%s: partition %d now at %d, the confirmation says %d", what, m.partition, pos[m.partition], m.from)
		}
		lo, hi := min(m.from, m.to), max(m.from, m.to)
		n := e.queryInt(`SELECT count(*) FROM outbox_message_t WHERE topic_id = 1 AND partition_id = $1 AND c_offset >= $2 AND c_offset < $3`,
			m.partition, lo, hi)
		wantReplay, wantSkip := int64(0), int64(0)
		if m.to < m.from {
			wantReplay = n
		} else {
			wantSkip = n
		}
		if m.replay != wantReplay || m.skip != wantSkip {
			e.t.Errorf("%s: partition %d (%d -> %d): the confirmation says %d replayed, %d skipped; the database holds %d, %d",
				what, m.partition, m.from, m.to, m.replay, m.skip, wantReplay, wantSkip)
		}
		replay += wantReplay
		skip += wantSkip
	}
	if got := find(e.t, body, `id="reset-replay">([\d,]+)<`); got != human.Count(replay) {
		e.t.Errorf("%s: the confirmation's total replayed is %s, the database's %d", what, got, replay)
	}
	if got := find(e.t, body, `id="reset-skip">([\d,]+)<`); got != human.Count(skip) {
		e.t.Errorf("%s: the confirmation's total skipped is %s, the database's %d", what, got, skip)
	}
}

// TestResetConfirmationIsExact: for a reset to earliest, latest, an
// offset and a time, the confirmation shows each partition's position,
// where the reset puts it, and exactly the events the database holds in
// between (replayed or skipped); the preview changes nothing; confirmed,
// the reset puts the positions exactly where the confirmation said, with
// an audit row on the group's page and a log line. A confirmation made
// stale (positions that are no longer the reset's) changes nothing and
// shows the new numbers. A running group needs force.
func TestResetConfirmationIsExact(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4, console.Options{})
	for i := range 60 {
		e.appendTx(ev(fmt.Sprintf("h%d", i%23), "t", fmt.Sprintf(`{"i":%d}`, i)), ev(fmt.Sprintf("h%d", (i+4)%23), "t", `{}`))
	}
	var mid time.Time
	if err := e.pool.QueryRow(e.ctx, `SELECT created_at FROM outbox_message_t ORDER BY created_at OFFSET 50 LIMIT 1`).Scan(&mid); err != nil {
		t.Fatal(err)
	}
	e.subscribe("g")
	e.exec(`UPDATE consumer_offsets o SET next_offset = coalesce((SELECT m.c_offset FROM outbox_message_t m
		WHERE m.partition_id = o.partition_id ORDER BY m.c_offset
		OFFSET (SELECT count(*) * (1 + o.partition_id) / 6 FROM outbox_message_t x WHERE x.partition_id = o.partition_id) LIMIT 1), o.next_offset)
		WHERE group_id = 'g'`)
	c := e.client()
	c.signIn("ada", testToken)
	path := "/topics/1/groups/g/reset"
	var midOffset int64
	if err := e.pool.QueryRow(e.ctx, `SELECT c_offset FROM outbox_message_t ORDER BY c_offset OFFSET 40 LIMIT 1`).Scan(&midOffset); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ to, value string }{
		{"earliest", ""}, {"offset", strconv.FormatInt(midOffset, 10)}, {"time", mid.UTC().Format(time.RFC3339Nano)}, {"latest", ""},
	} {
		what := "reset to " + tt.to
		before := e.dbState()
		r := c.post(path, url.Values{"to": {tt.to}, "value": {tt.value}}, true)
		if r.status != http.StatusOK {
			t.Fatalf("%s, preview: %d\n%s", what, r.status, r.body)
		}
		if after := e.dbState(); after != before {
			t.Fatalf("%s: the preview changed the database:\nbefore %s\nafter  %s", what, before, after)
		}
		moves, expect := parseMoves(t, r.body)
		e.checkPreview(what, moves, r.body)
		if tt.to == "earliest" {
			for _, m := range moves {
				if first := e.queryInt(`SELECT min(c_offset) FROM outbox_message_t WHERE partition_id = $1`, m.partition); m.to != first {
					t.Errorf("%s: partition %d goes to %d, its first event is %d", what, m.partition, m.to, first)
				}
			}
		}
		r = c.post(path, url.Values{"to": {tt.to}, "value": {tt.value}, "confirm": {"1"}, "expect": {expect}}, true)
		if r.status != http.StatusSeeOther {
			t.Fatalf("%s, confirmed: %d\n%s", what, r.status, r.body)
		}
		pos := e.positions("g")
		for _, m := range moves {
			if pos[m.partition] != m.to {
				t.Errorf("%s: partition %d is at %d, the confirmation said %d", what, m.partition, pos[m.partition], m.to)
			}
		}
		page := c.mustGet(r.header.Get("Location"))
		if !strings.Contains(page, `data-action="reset"`) || !strings.Contains(page, "to "+strings.TrimSuffix(tt.to+":"+tt.value, ":")) {
			t.Errorf("%s: the group page shows no audit row of it", what)
		}
	}
	if n := strings.Count(e.logs.String(), `"action":"reset"`); n != 4 {
		t.Errorf("%d log lines of resets, want 4", n)
	}
	if n := e.queryInt(`SELECT count(*) FROM console_audit WHERE action = 'reset' AND actor = 'ada' AND outcome = 'ok'`); n != 4 {
		t.Errorf("%d audit rows of resets by ada, want 4", n)
	}

	// A stale confirmation: nothing moves, the new numbers are shown.
	r := c.post(path, url.Values{"to": {"earliest"}}, true)
	moves, expect := parseMoves(t, r.body)
	stale := strings.Replace(expect, fmt.Sprintf("%d:%d", moves[0].partition, moves[0].to), fmt.Sprintf("%d:%d", moves[0].partition, moves[0].to+1), 1)
	before := e.positions("g")
	r = c.post(path, url.Values{"to": {"earliest"}, "confirm": {"1"}, "expect": {stale}}, true)
	if r.status != http.StatusConflict || !strings.Contains(r.body, `id="notice"`) {
		t.Fatalf("stale confirmation: %d\n%s", r.status, r.body)
	}
	if after := e.positions("g"); fmtMap(after) != fmtMap(before) {
		t.Fatalf("a stale confirmation moved the positions: %v -> %v", before, after)
	}
	e.checkPreview("the confirmation shown again", moves, r.body)

	// A live replica: refused without force, offered with it.
	e.exec(`INSERT INTO consumer_replicas (group_id, topic_id, replica_id, mode, expires_at)
		VALUES ('g', 1, 'r1', 'auto', clock_timestamp() + interval '1 hour')`)
	r = c.post(path, url.Values{"to": {"earliest"}}, true)
	if r.status != http.StatusConflict || !strings.Contains(r.body, `id="reset-force"`) {
		t.Fatalf("reset of a running group without force: %d\n%s", r.status, r.body)
	}
	r = c.post(path, url.Values{"to": {"earliest"}, "force": {"1"}}, true)
	if r.status != http.StatusOK {
		t.Fatalf("forced preview: %d\n%s", r.status, r.body)
	}
	if fmtMap(e.positions("g")) != fmtMap(before) {
		t.Fatal("previews moved the positions")
	}
}
