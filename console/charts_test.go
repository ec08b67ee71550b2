package console_test

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/console"
	"github.com/pgevents/pgevents/offsets"
)

// TestNoSampleYet: before maintenance wrote a sample, the overview and a
// group's page render, and every rate and chart says "—" or "no sample
// yet", with a title that says why; maintenance shows as never run.
// After one sample the lag is drawn (a point: the lag the database
// counts), and a rate still waits for a second sample, saying so.
func TestNoSampleYet(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, console.Options{})
	e.fixture()
	c := e.client()
	overview, group := c.mustGet("/"), c.mustGet("/topics/1/groups/g")
	for name, body := range map[string]string{"overview": overview, "group": group} {
		if n := strings.Count(body, `title="no sample yet: maintenance writes one every 10 s while a consumer (or consumer maintain) runs">—<`); n < 1 {
			t.Errorf("%s: no rate shows — with why", name)
		}
		if strings.Contains(body, `data-series=`) || !strings.Contains(body, `<text class="empty" x="4" y="11">no sample yet</text>`) {
			t.Errorf("%s: a chart draws something, or none says there is no sample", name)
		}
	}
	if !strings.Contains(groupRow(t, overview, "h"), `title="no sample yet: maintenance writes one every 10 s while a consumer (or consumer maintain) runs">—</td>`) {
		t.Errorf("group h's rate: %s", groupRow(t, overview, "h"))
	}
	if !strings.Contains(overview, `<dd class="maintenance"><span class="bad">never ran`) {
		t.Error("the overview does not say that maintenance never ran")
	}

	e.sample()
	overview = c.mustGet("/")
	row := groupRow(t, overview, "g")
	lag := e.queryInt(`SELECT count(*) FROM outbox_message_t m JOIN consumer_offsets o ON o.partition_id = m.partition_id
		WHERE o.group_id = 'g' AND m.c_offset >= o.next_offset`)
	if !strings.Contains(row, `title="one sample so far: a rate needs the next, within 10 s">—</td>`) ||
		!strings.Contains(row, `data-series="lag" data-t="`) || find(t, row, `data-series="lag" data-t="-?\d+" data-v="(\d+)"`) != fmt.Sprint(lag) {
		t.Errorf("after one sample, group g (lag %d): %s", lag, row)
	}
	if strings.Contains(overview, "never ran") {
		t.Error("maintenance never ran, after a sample")
	}
}

// chartPoints counts the points each drawn path of body has, by chart.
func chartPoints(body string) map[string]int {
	out := map[string]int{}
	for _, m := range regexp.MustCompile(`data-series="([a-z]+)"[^>]* d="([^"]*)"`).FindAllStringSubmatch(body, -1) {
		out[m[1]] = max(out[m[1]], strings.Count(m[2], "M")+strings.Count(m[2], "L"))
	}
	return out
}

// TestPageWeight: with an hour of samples (every 10 s) for a topic of 8
// partitions and 6 groups, the overview and a group's page stay under the
// budget docs/operating.md states (they are fetched again every 2 s while
// open), and no chart draws more points than its width allows.
func TestPageWeight(t *testing.T) {
	t.Parallel()
	const (
		partitions = 8
		groups     = 6
		// The budget, as docs/operating.md states it: the overview 8 KB
		// per topic and 5 KB per group, a group's page 20 KB and 4 KB per
		// partition.
		overviewBudget = 8_000 + 5_000*groups
		groupBudget    = 20_000 + 4_000*partitions
	)
	e := newEnv(t, partitions, console.Options{})
	for i := range groups {
		e.subscribe(fmt.Sprintf("group-%d", i))
	}
	e.exec(`INSERT INTO topic_samples (topic_id, bucket, taken_at, seconds, appended, heads, writer)
		SELECT 1, b, b, 10, (100 + random() * 900)::bigint, array_fill(123456789::bigint, ARRAY[$1::int]), 'pgevents maintenance replica-0123456789'
		FROM generate_series(clock_timestamp() - interval '1 hour' + interval '5 s', clock_timestamp(), interval '10 s') b`, partitions)
	e.exec(`INSERT INTO group_samples (topic_id, bucket, group_id, taken_at, seconds, handled, lag, lag_capped, lag_seconds,
		dead_letters, dead_lettered, positions, part_handled, part_lag, part_lag_seconds, dead_letters_seen)
		SELECT 1, s.bucket, 'group-' || g, s.taken_at, 10, (100 + random() * 900)::bigint, (random() * 1e6)::bigint, false, random() * 3600,
		       3, (random() * 2)::bigint,
		       array_fill(123456789::bigint, ARRAY[$1::int]),
		       (SELECT array_agg((random() * 100)::bigint) FROM generate_series(1, $1::int)),
		       (SELECT array_agg((random() * 1e5)::bigint) FROM generate_series(1, $1::int)),
		       (SELECT array_agg(random() * 3600) FROM generate_series(1, $1::int)),
		       array_fill(0::bigint, ARRAY[$1::int])
		FROM topic_samples s, generate_series(0, $2::int - 1) g`, partitions, groups)
	c := e.client()
	c.signIn("ada", testToken) // the action forms too
	for _, p := range []struct {
		path   string
		budget int
	}{{"/", overviewBudget}, {"/topics/1/groups/group-0", groupBudget}} {
		body := c.mustGet(p.path)
		t.Logf("GET %s: %d bytes (budget %d)", p.path, len(body), p.budget)
		if len(body) > p.budget {
			t.Errorf("GET %s: %d bytes, over the budget of %d", p.path, len(body), p.budget)
		}
		for series, n := range chartPoints(body) {
			if n > 100 {
				t.Errorf("GET %s: series %s draws %d points, more than a chart's width allows", p.path, series, n)
			}
		}
	}
}

// chartData is what a chart's series carries: its points' times (Unix
// milliseconds) and values.
type chartData struct {
	T []int64
	V []float64
}

// readChart reads the data of the series of the chart sel (a CSS selector
// of its svg element) in the browser, in one evaluation (a live refresh
// may replace the chart between two).
func readChart(t *testing.T, ctx context.Context, sel, series string) chartData {
	t.Helper()
	js := `(() => { const svg = document.querySelector(` + strconv.Quote(sel) + `);
		if (!svg) return null;
		const p = svg.querySelector('path[data-series=` + strconv.Quote(series) + `]');
		if (!p) return {T: [], V: []};
		const end = Number(svg.getAttribute('data-end'));
		const t = p.getAttribute('data-t').split(' ').map(x => end + Number(x));
		const v = p.getAttribute('data-v').split(' ').map(Number);
		return {T: t, V: v}; })()`
	d, err := chromedp.Run(ctx, chromedp.Evaluate[*chartData](js))
	if err != nil {
		t.Fatalf("chart %s: %v", sel, err)
	}
	if d == nil {
		t.Fatalf("no chart %s on the page", sel)
	}
	return *d
}

// samplePoint is a sample's time and a figure of it, from SQL.
type samplePoint struct {
	At time.Time
	V  float64
}

// sqlPoints reads points from SQL: rows of (taken_at, value), oldest
// first; a NULL value is no point.
func (e *env) sqlPoints(sql string, args ...any) []samplePoint {
	e.t.Helper()
	rows, err := e.pool.Query(e.ctx, sql, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	var out []samplePoint
	var at time.Time
	var v *float64
	if _, err := pgx.ForEachRow(rows, []any{&at, &v}, func() error {
		if v != nil {
			out = append(out, samplePoint{at, *v})
		}
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// samePoints reports how a chart's data differs from the samples' (""
// when they agree: the same times to the millisecond, the values to the
// 6 significant digits a chart writes).
func samePoints(got chartData, want []samplePoint) string {
	if len(got.T) != len(want) || len(got.V) != len(want) {
		return fmt.Sprintf("%d points drawn, %d samples: %v, want %v", len(got.T), len(want), got, want)
	}
	for i, w := range want {
		if got.T[i] != w.At.UnixMilli() || math.Abs(got.V[i]-w.V) > 1e-5*math.Max(1, math.Abs(w.V)) {
			return fmt.Sprintf("point %d: (%d, %g), the sample's (%d, %g)", i, got.T[i], got.V[i], w.At.UnixMilli(), w.V)
		}
	}
	return ""
}

// TestBrowserChartsFollowTheSamples drives a group that falls behind and
// recovers, sampling as maintenance does at each step, and reads the
// charts in Chromium: each point of the group's lag, of its handling
// rate, of the topic's appended rate and of a partition's lag is the
// sample's, as SQL reads it; the samples say what the log says (the lag
// the log counts past the positions while the group is paused, the events
// handled between two samples); the verdict reads "falling behind since"
// while it is, then "keeps up", and the page changes by its live refresh,
// without a reload. Before any sample, the page shows "—" with why.
func TestBrowserChartsFollowTheSamples(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, console.Options{})
	e.subscribe("g")
	ctx := browser(t)
	base := e.srv.URL
	liveText := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector(`+strconv.Quote(sel)+`).textContent.replace(/\s+/g, ' ').trim()`))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return s
	}
	attr := func(sel, name string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector(`+strconv.Quote(sel)+`).getAttribute(`+strconv.Quote(name)+`)`))
		if err != nil {
			t.Fatalf("%s of %s: %v", name, sel, err)
		}
		return s
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/topics/1/groups/g"), chromedp.WaitVisible(chromedp.CSS(`#group-rate`))); err != nil {
		t.Fatal(err)
	}
	if got, title := liveText(`#group-rate`), attr(`#group-rate`, "title"); got != "—" || !strings.HasPrefix(title, "no sample yet: maintenance writes one") {
		t.Fatalf("before any sample the rate reads %q (title %q), want — and why", got, title)
	}

	// The group's consumer; its own maintenance passes come once an hour
	// (the test samples at each step instead).
	var poisoned atomic.Bool
	e.startGroup(2, pgevents.PolicyDeadLetter, &poisoned, func(c *pgevents.Config) { c.MaintenanceInterval = time.Hour })
	lagInLog := func() int64 {
		return e.queryInt(`SELECT count(*) FROM outbox_message_t m JOIN consumer_offsets o ON o.partition_id = m.partition_id AND o.topic_id = m.topic_id
			WHERE o.group_id = 'g' AND m.c_offset >= o.next_offset`)
	}
	appendN := func(n, from int) {
		for i := range n {
			e.appendTx(ev(fmt.Sprintf("h%d", (from+i)%7), "t", `{}`))
		}
	}
	s0 := e.sample()
	appendN(20, 0)
	waitFor(t, "20 handled", func() bool { return e.handled() == 20 })
	s1 := e.sample()
	if _, err := offsets.SetState(e.ctx, e.pool, "g", 1, "PAUSED"); err != nil {
		t.Fatal(err)
	}
	appendN(30, 20)
	s2 := e.sample()
	lag2 := lagInLog()
	appendN(30, 50)
	s3 := e.sample()
	lag3 := lagInLog()
	if lag2 != 30 || lag3 != 60 {
		t.Fatalf("paused, the log holds %d then %d events past the positions, want 30 and 60 (handled %d)", lag2, lag3, e.handled())
	}
	if got := liveText(`#group-verdict`); !strings.HasPrefix(got, "falling behind since") {
		waitFor(t, "the verdict refreshed: falling behind", func() bool { return strings.HasPrefix(liveText(`#group-verdict`), "falling behind since") })
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.__marker = 7`)); err != nil {
		t.Fatal(err)
	}
	if _, err := offsets.SetState(e.ctx, e.pool, "g", 1, "ACTIVE"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "80 handled", func() bool { return e.handled() == 80 })
	s4 := e.sample()
	waitFor(t, "the page refreshed by itself: the group keeps up, and the chart has the last sample", func() bool {
		d := readChart(t, ctx, `#group-summary svg[data-chart="lag"]`, "lag")
		return liveText(`#group-verdict`) == "keeps up" && len(d.T) > 0 && d.T[len(d.T)-1] == s4.At.UnixMilli()
	})
	if n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.__marker || 0`)); err != nil || n != 7 {
		t.Fatalf("the page reloaded to refresh (%d, %v)", n, err)
	}

	// What the samples say, against the log. (The consumer's maintenance
	// samples once as it starts, which may fall between two of the test's:
	// the events handled from one test sample to the next are the sum of
	// the samples between.)
	handledAt := func(from, to time.Time) int64 {
		return e.queryInt(`SELECT coalesce(sum(handled), 0) FROM group_samples WHERE group_id = 'g' AND taken_at > $1 AND taken_at <= $2`, from, to)
	}
	lagAt := func(s time.Time) int64 {
		return e.queryInt(`SELECT lag FROM group_samples WHERE group_id = 'g' AND taken_at = $1`, s)
	}
	if got := []int64{handledAt(s0.At, s1.At), handledAt(s1.At, s2.At), handledAt(s2.At, s3.At), handledAt(s3.At, s4.At)}; fmt.Sprint(got) != "[20 0 0 60]" {
		t.Errorf("events handled in samples S1..S4: %v, the log's [20 0 0 60]", got)
	}
	if got := []int64{lagAt(s1.At), lagAt(s2.At), lagAt(s3.At), lagAt(s4.At)}; fmt.Sprint(got) != fmt.Sprint([]int64{0, lag2, lag3, 0}) {
		t.Errorf("lag in samples S1..S4: %v, the log's [0 %d %d 0]", got, lag2, lag3)
	}
	// What the charts draw, against the samples.
	groupLag := e.sqlPoints(`SELECT taken_at, lag::float8 FROM group_samples WHERE group_id = 'g' ORDER BY bucket`)
	groupRate := e.sqlPoints(`SELECT taken_at, handled / seconds FROM group_samples WHERE group_id = 'g' ORDER BY bucket`)
	topicRate := e.sqlPoints(`SELECT taken_at, appended / seconds FROM topic_samples ORDER BY bucket`)
	groupAge := e.sqlPoints(`SELECT taken_at, lag_seconds FROM group_samples WHERE group_id = 'g' ORDER BY bucket`)
	part0 := e.sqlPoints(`SELECT taken_at, part_lag[1]::float8 FROM group_samples WHERE group_id = 'g' ORDER BY bucket`)
	for _, c := range []struct {
		sel, series string
		want        []samplePoint
	}{
		{`#group-summary svg[data-chart="lag"]`, "lag", groupLag},
		{`#group-summary svg[data-chart="rate"]`, "handled", groupRate},
		{`#group-summary svg[data-chart="rate"]`, "appended", topicRate},
		{`#group-summary svg[data-chart="age"]`, "age", groupAge},
		{`tr.partition[data-partition="0"] svg[data-chart="lag"]`, "lag", part0},
	} {
		if diff := samePoints(readChart(t, ctx, c.sel, c.series), c.want); diff != "" {
			t.Errorf("group page, %s %s: %s", c.sel, c.series, diff)
		}
	}
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(`#overview`))); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sel, series string
		want        []samplePoint
	}{
		{`tr[data-group="g"] svg[data-chart="lag"]`, "lag", groupLag},
		{`tr[data-group="g"] svg[data-chart="rate"]`, "handled", groupRate},
		{`#topic-1 svg[data-chart="appended"]`, "appended", topicRate},
	} {
		if diff := samePoints(readChart(t, ctx, c.sel, c.series), c.want); diff != "" {
			t.Errorf("overview, %s %s: %s", c.sel, c.series, diff)
		}
	}
	if got := liveText(`tr[data-group="g"] .verdict`); got != "keeps up" {
		t.Errorf("the overview says group g %q", got)
	}
}
