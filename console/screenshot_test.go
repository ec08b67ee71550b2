package console_test

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/schema"
)

// EnvDocsScreenshots names the environment variable that makes
// TestDocsScreenshots write docs/operating.md's screenshots (console.png,
// console-group.png) into docs/, from the pictures it checks: set it to
// 1. Without it nothing is written. Regenerate them with:
//
//	PGEVENTS_SCREENSHOTS=1 go test -p 1 -count=1 -run TestDocsScreenshots ./console/
const EnvDocsScreenshots = "PGEVENTS_SCREENSHOTS"

// seedScenario fills env with the scenario of docs/operating.md's
// screenshots, seeded, as of the database's clock: topic 1 (4 partitions)
// received 24,000 events over the last hour, about 6.7 a second; group
// billing keeps up; emails slowed down 20 minutes ago and handles 60 % of
// what arrives since (it falls behind); analytics was paused 35 minutes
// ago (stalled); search-index halted on a dead letter in partition 2 12
// minutes ago. Topic 2 is sequenced and its sequencer froze 9 minutes ago:
// its producers' events wait in staging, which its group ledger counts as
// lag. A consumer holds topic 1's watcher key; topic 2 needs no watcher
// (its ticks announce what they move), and nobody holds its sequencer's. The hour of samples is what maintenance would have
// written for that story (seeded noise), ending with the state the
// database shows now.
func seedScenario(t *testing.T, e *env) {
	t.Helper()
	const (
		events = 24_000
		hour   = time.Hour
	)
	var now time.Time
	if err := e.pool.QueryRow(e.ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
		t.Fatal(err)
	}
	start := now.Add(-hour)
	// The log: events of 37 customers, created evenly over the hour.
	e.exec(`SELECT count(*) FROM append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', 'customer-' || (i % 37),
		'event_type', (ARRAY['order.created', 'order.paid', 'order.shipped', 'invoice.sent'])[1 + i % 4],
		'payload', jsonb_build_object('order', 1000 + i, 'amount', 10 + i % 90, 'currency', 'EUR')))
		FROM generate_series(1, $1::int) i))`, events)
	// (Each partition's spread evenly: hosts do not spread evenly over
	// the partitions.)
	e.exec(`UPDATE outbox_message_t m SET created_at = $1::timestamptz + o.f * $2::float8 * interval '1 second'
		FROM (SELECT partition_id, c_offset,
		             (row_number() OVER (PARTITION BY partition_id ORDER BY c_offset) - 1)::float8
		             / count(*) OVER (PARTITION BY partition_id) AS f
		      FROM outbox_message_t WHERE topic_id = 1) o
		WHERE m.topic_id = 1 AND m.partition_id = o.partition_id AND m.c_offset = o.c_offset`, start, hour.Seconds())
	// positionAt moves group's position in every partition (or in
	// partition only, when >= 0) to the first event created at or after at.
	positionAt := func(group string, partition int, at time.Time) {
		e.exec(`UPDATE consumer_offsets o SET next_offset = coalesce((SELECT min(m.c_offset) FROM outbox_message_t m
			WHERE m.topic_id = 1 AND m.partition_id = o.partition_id AND m.created_at >= $2),
			(SELECT max(m.c_offset) + 1 FROM outbox_message_t m WHERE m.topic_id = 1 AND m.partition_id = o.partition_id))
			WHERE o.group_id = $1 AND o.topic_id = 1 AND ($3 < 0 OR o.partition_id = $3)`, group, at, partition)
	}
	for _, g := range []string{"analytics", "billing", "emails", "search-index"} {
		e.subscribe(g)
	}
	positionAt("billing", -1, now)
	positionAt("emails", -1, now.Add(-8*time.Minute)) // 60 % of the last 20 minutes handled
	positionAt("analytics", -1, now.Add(-35*time.Minute))
	positionAt("search-index", -1, now)
	positionAt("search-index", 2, now.Add(-12*time.Minute))
	e.exec(`UPDATE subscriptions SET state = 'PAUSED', state_changed_at = $1 WHERE group_id = 'analytics'`, now.Add(-35*time.Minute))
	var haltAt int64
	if err := e.pool.QueryRow(e.ctx, `SELECT next_offset FROM consumer_offsets WHERE group_id = 'search-index' AND partition_id = 2`).Scan(&haltAt); err != nil {
		t.Fatal(err)
	}
	if err := store.Halt(e.ctx, e.pool, "search-index", 1, 2, haltAt, `permanent: mapping for field "amount" rejects the value`); err != nil {
		t.Fatal(err)
	}
	for _, dl := range []struct {
		group  string
		offset string
		error  string
	}{{"search-index", "(SELECT next_offset FROM consumer_offsets WHERE group_id = 'search-index' AND partition_id = 2)",
		`permanent: mapping for field "amount" rejects the value`},
		{"emails", "(SELECT next_offset - 40 FROM consumer_offsets WHERE group_id = 'emails' AND partition_id = 1)",
			"permanent: mail server rejected the address"}} {
		e.exec(`INSERT INTO dead_letter_queue (group_id, topic_id, partition_id, first_offset, last_offset,
			transaction_id, event_ids, host_ids, events, error, attempts, first_failed_at, last_failed_at, parked_hosts)
			SELECT $1, 1, m.partition_id, m.c_offset, m.c_offset, m.transaction_id, ARRAY[m.event_id], ARRAY[m.host_id],
			       jsonb_build_array(to_jsonb(m)), $2, 3, now(), now(), true
			FROM outbox_message_t m WHERE m.topic_id = 1 AND m.c_offset = `+dl.offset+` LIMIT 1`, dl.group, dl.error)
	}
	e.exec(`UPDATE partition_halts SET halted_at = $1`, now.Add(-12*time.Minute))
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
	// A consumer's watcher holds topic 1's key (as consumers elect one).
	holder, err := e.pool.Acquire(e.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = holder.Conn().Close(context.Background()) // the session holds the key: not given back to the pool
		holder.Release()
	})
	e.execOn(holder.Conn(), `SELECT set_config('application_name', 'pgevents watcher billing-7f9c', false), pg_advisory_lock(lock_key('watch', '1'))`)

	// Topic 2, sequenced: 1,800 events sequenced before the sequencer
	// froze, 9 minutes ago; 700 staged since.
	if _, _, err := schema.EnsureTopicSpec(e.ctx, e.pool, schema.TopicSpec{ID: 2, Partitions: 2, Scope: schema.ScopeSequenced}); err != nil {
		t.Fatal(err)
	}
	stage := func(n int) {
		e.exec(`SELECT count(*) FROM append_events(2, (SELECT jsonb_agg(jsonb_build_object('host_id', 'account-' || (i % 13),
			'event_type', 'ledger.entry')) FROM generate_series(1, $1::int) i))`, n)
	}
	stage(1800)
	e.exec(`SELECT sequence_tick(2)`)
	e.exec(`UPDATE outbox_message_t SET created_at = $1::timestamptz + c_offset * interval '1 second' WHERE topic_id = 2`, start)
	stage(700)
	e.exec(`UPDATE staged_events SET created_at = $1::timestamptz + (seq % 700) * interval '770 milliseconds' WHERE topic_id = 2`, now.Add(-9*time.Minute))
	e.exec(`UPDATE sequencer_ticks SET ticked_at = $1 WHERE topic_id = 2`, now.Add(-9*time.Minute))
	if _, _, err := store.Subscribe(e.ctx, e.pool, "ledger", 2, store.Start{Kind: "latest"}, time.Hour); err != nil {
		t.Fatal(err)
	}

	// The hour of samples, and the last one as the database is now.
	rng := rand.New(rand.NewPCG(36, 36))
	type story struct {
		group   string
		topic   int
		since   time.Duration // behind since that long ago (0: keeps up)
		share   float64       // of what arrives that it handles once behind
		parts   int
		dead    float64 // dead letters per minute, on average
		onlyOne int     // behind in this partition only (-1: all)
	}
	stories := []story{
		{"billing", 1, 0, 1, 4, 0, -1},
		{"emails", 1, 20 * time.Minute, 0.6, 4, 0.15, -1},
		{"analytics", 1, 35 * time.Minute, 0, 4, 0, -1},
		{"search-index", 1, 12 * time.Minute, 0.75, 4, 0, 2},
		{"ledger", 2, 9 * time.Minute, 0, 2, 0, -1},
	}
	rate := map[int]float64{1: float64(events) / hour.Seconds(), 2: 5}
	lagNow := func(group string, topic int) []int64 {
		rows, err := e.pool.Query(e.ctx, `SELECT o.partition_id, (SELECT count(*) FROM outbox_message_t m
			WHERE m.topic_id = o.topic_id AND m.partition_id = o.partition_id AND m.c_offset >= o.next_offset)
			FROM consumer_offsets o WHERE o.group_id = $1 AND o.topic_id = $2 ORDER BY o.partition_id`, group, topic)
		if err != nil {
			t.Fatal(err)
		}
		var out []int64
		var p int
		var n int64
		if _, err := pgx.ForEachRow(rows, []any{&p, &n}, func() error { out = append(out, n); return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	const period = 10 * time.Second
	buckets := int(hour / period)
	var batch pgx.Batch
	finals := map[string][]int64{}
	for _, s := range stories {
		finals[s.group] = lagNow(s.group, s.topic)
	}
	for b := 0; b <= buckets; b++ {
		at := start.Add(time.Duration(b) * period)
		if b == buckets {
			at = now.Add(-2 * time.Second)
		}
		bucket := at // a key of its own for each
		for topic, r := range rate {
			appended := int64(math.Round(r * period.Seconds() * (0.85 + 0.3*rng.Float64())))
			if topic == 2 && now.Sub(at) < 9*time.Minute {
				appended = 0 // the sequencer froze: nothing reaches the log
			}
			var staged *int64
			if topic == 2 {
				n := int64(0)
				if d := now.Sub(at); d < 9*time.Minute {
					n = int64(700 * (1 - d.Seconds()/(9*time.Minute).Seconds()))
				}
				staged = &n
			}
			batch.Queue(`INSERT INTO topic_samples (topic_id, bucket, taken_at, seconds, appended, heads, staged, writer)
				VALUES ($1, $2, $3, $4, $5, '{}', $6, 'pgevents maintenance billing-7f9c')`,
				topic, bucket, at, nilIfFirst(b, period.Seconds()), nilIfFirstInt(b, appended), staged)
		}
		for _, s := range stories {
			behind := s.since > 0 && now.Sub(at) < s.since
			frac := 0.0 // of the final lag reached at this sample
			if behind {
				frac = 1 - now.Sub(at).Seconds()/s.since.Seconds()
			}
			final := finals[s.group]
			if s.group == "ledger" {
				final = []int64{350, 350} // the staged events, each partition's share
			}
			partLag := make([]int64, s.parts)
			partAge := make([]float64, s.parts)
			partHandled := make([]*int64, s.parts)
			var lag, handled int64
			maxAge := 0.0
			for p := range s.parts {
				in := rate[s.topic] * period.Seconds() / float64(s.parts) * (0.85 + 0.3*rng.Float64())
				h := in
				if behind && (s.onlyOne < 0 || s.onlyOne == p) {
					h = in * s.share
					partLag[p] = int64(float64(final[p]) * frac)
					partAge[p] = (s.since.Seconds() - now.Sub(at).Seconds()) * (1 - s.share)
					if s.share == 0 {
						partAge[p] = s.since.Seconds() - now.Sub(at).Seconds()
					}
				} else {
					partLag[p] = int64(in * (0.1 + 0.1*rng.Float64()))
					partAge[p] = 0.3 + 0.4*rng.Float64()
				}
				n := int64(math.Round(h))
				partHandled[p] = &n
				lag += partLag[p]
				handled += n
				maxAge = max(maxAge, partAge[p])
			}
			dead := int64(0)
			if s.dead > 0 && rng.Float64() < s.dead*period.Minutes() {
				dead = 1
			}
			batch.Queue(`INSERT INTO group_samples (topic_id, bucket, group_id, taken_at, seconds, handled, lag, lag_capped, lag_seconds,
				dead_letters, dead_lettered, positions, part_handled, part_lag, part_lag_seconds, dead_letters_seen)
				VALUES ($1, $2, $3, $4, $5, $6, $7, false, $8, 0, $9, '{}', $10, $11, $12, '{}')`,
				s.topic, bucket, s.group, at, nilIfFirst(b, period.Seconds()), nilIfFirstInt(b, handled), lag, maxAge,
				nilIfFirstInt(b, dead), partHandled, partLag, partAge)
		}
	}
	if err := e.pool.SendBatch(e.ctx, &batch).Close(); err != nil {
		t.Fatal(err)
	}
}

func nilIfFirst(b int, v float64) *float64 {
	if b == 0 {
		return nil
	}
	return &v
}

func nilIfFirstInt(b int, v int64) *int64 {
	if b == 0 {
		return nil
	}
	return &v
}

// TestDocsScreenshots draws the scenario of docs/operating.md's
// screenshots (seedScenario) in Chromium and checks what an operator
// reads there: which group keeps up and since when the others do not,
// which process holds each role and which role nobody holds. With
// PGEVENTS_SCREENSHOTS=1 it writes the screenshots into docs/, at a fixed
// viewport, recompressed.
func TestDocsScreenshots(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 4, console.Options{ReadOnly: true})
	seedScenario(t, e)
	ctx := browser(t)
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector(`+fmt.Sprintf("%q", sel)+`).textContent.replace(/\s+/g, ' ').trim()`))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	// Every header sits as its column's cells do: a right-aligned number
	// under a right-aligned header.
	aligned := func(table string) {
		t.Helper()
		bad, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`(() => {
			const out = [];
			document.querySelectorAll(`+fmt.Sprintf("%q", table)+`).forEach(tb => {
				const ths = tb.querySelectorAll('thead th');
				tb.querySelectorAll('tbody tr').forEach(tr => tr.querySelectorAll('td').forEach((td, i) => {
					if (!ths[i] || tr.children.length !== ths.length) return;
					const a = getComputedStyle(ths[i]).textAlign, b = getComputedStyle(td).textAlign;
					if (a !== b) out.push(ths[i].textContent + ': header ' + a + ', cell ' + b);
				}));
			});
			return [...new Set(out)]; })()`))
		if err != nil {
			t.Fatal(err)
		}
		if len(bad) > 0 {
			t.Errorf("%s: columns not aligned with their headers: %q", table, bad)
		}
	}
	shots := []struct {
		file, path, ready string
		w, h              int64
		check             func()
	}{
		{"console.png", "/", `#overview`, 1360, 1180, func() {
			for group, want := range map[string]string{
				"billing": "keeps up", "emails": "falling behind since", "analytics": "stalled since", "search-index": "falling behind since",
				"ledger": "stalled since",
			} {
				if got := text(`tr[data-group="` + group + `"] .verdict`); !strings.HasPrefix(got, want) {
					t.Errorf("group %s: %q, want %q…\n%s", group, got, want, e.client().mustGet("/"))
				}
			}
			if got := text(`#topic-1 .watcher`); got != "pgevents watcher billing-7f9c" {
				t.Errorf("topic 1's watcher: %q", got)
			}
			for sel, want := range map[string]string{
				`#topic-2 .watcher`:        "none needed",
				`#topic-2 .sequencer .bad`: "none",
				`#topic-2 .staged`:         "700 staged",
			} {
				if got := text(sel); !strings.HasPrefix(got, want) {
					t.Errorf("%s: %q, want %q…", sel, got, want)
				}
			}
			if got := text(`#topic-1 .retention`); got != "7 d; 24 h without groups" {
				t.Errorf("topic 1's retention reads %q", got)
			}
			aligned(`table.groups`)
		}},
		{"console-group.png", "/topics/1/groups/emails", `#group-lag`, 1360, 1000, func() {
			if got := text(`#group-verdict`); !strings.HasPrefix(got, "falling behind since") {
				t.Errorf("emails: %q", got)
			}
			aligned(`table.partitions`)
		}},
	}
	for _, s := range shots {
		if err := chromedp.Do(ctx, chromedp.EmulateViewport(s.w, s.h), chromedp.Navigate(e.srv.URL+s.path),
			chromedp.WaitVisible(chromedp.CSS(s.ready))); err != nil {
			t.Fatalf("%s: %v", s.path, err)
		}
		s.check()
		if os.Getenv(EnvDocsScreenshots) != "1" {
			continue
		}
		buf, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatalf("%s: %v", s.path, err)
		}
		out, err := shrinkPNG(buf)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join("..", "docs", s.file)
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d KB, from %d KB)", path, len(out)/1024, len(buf)/1024)
	}
}

// shrinkPNG recodes a screenshot as a paletted PNG of its 256 most
// frequent colors, each other color (a shade of text antialiasing) drawn
// with the nearest of them, at the best compression: a page has few
// colors, and the picture stays as sharp.
func shrinkPNG(b []byte) ([]byte, error) {
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	r := img.Bounds()
	counts := map[color.RGBA]int{}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			counts[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	colors := make([]color.RGBA, 0, len(counts))
	for c := range counts {
		colors = append(colors, c)
	}
	sort.Slice(colors, func(i, j int) bool {
		if counts[colors[i]] != counts[colors[j]] {
			return counts[colors[i]] > counts[colors[j]]
		}
		a, b := colors[i], colors[j]
		return uint32(a.R)<<24|uint32(a.G)<<16|uint32(a.B)<<8|uint32(a.A) < uint32(b.R)<<24|uint32(b.G)<<16|uint32(b.B)<<8|uint32(b.A)
	})
	pal := make(color.Palette, 0, 256)
	for _, c := range colors[:min(len(colors), 256)] {
		pal = append(pal, c)
	}
	out := image.NewPaletted(r, pal)
	index := map[color.RGBA]uint8{}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			i, ok := index[c]
			if !ok {
				i = uint8(pal.Index(c))
				index[c] = i
			}
			out.SetColorIndex(x, y, i)
		}
	}
	var w bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&w, out); err != nil {
		return nil, err
	}
	return w.Bytes(), nil
}
