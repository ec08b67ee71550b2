package console

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/human"
	"github.com/pgevents/pgevents/schema"
)

// The history the pages draw is the samples maintenance writes
// (pgevents.Maintain, migration 0022): one per topic and period, in the
// database, so that every console, restarted or not, draws the same
// picture. A console reads them; it writes none.
const (
	// chartWindow is the time the charts show, up to the database clock.
	chartWindow = time.Hour
	// keepUpAge is the lag age under which a group keeps up: its oldest
	// unhandled event is younger than this.
	keepUpAge = 10 * time.Second
	// minStale is the shortest time without a sample after which the
	// maintenance role is shown as not held (see staleAfter).
	minStale = 30 * time.Second
)

// topicSample is a row of topic_samples.
type topicSample struct {
	At       time.Time
	Seconds  *float64 // since the previous sample; nil for the first
	Appended *int64
	Staged   *int64
	Writer   string
}

// groupSample is a row of group_samples: a group's totals, and, on the
// group page, its partitions'.
type groupSample struct {
	At           time.Time
	Seconds      *float64
	Handled      *int64
	Lag          int64
	LagCapped    bool
	LagSeconds   float64
	DeadLetters  int64
	DeadLettered *int64
	// Per partition (group page only).
	PartHandled    []*int64
	PartLag        []int64
	PartLagSeconds []float64
}

// topicHistory is what the samples say about a topic.
type topicHistory struct {
	Samples []topicSample // of the window, oldest first
	Newest  *topicSample  // the newest sample, whatever its age; nil: none ever
	Now     time.Time     // the database clock when they were read
}

// topicSamples reads topic's samples of the window (topicSamplesSQL).
func (c *Console) topicSamples(ctx context.Context, topic int) (topicHistory, error) {
	var h topicHistory
	var all []topicSample
	rows, err := c.pool.Query(ctx, schema.SQL(ctx, topicSamplesSQL), topic, chartWindow.Milliseconds())
	if err != nil {
		return h, fmt.Errorf("console: samples of topic %d: %w", topic, err)
	}
	defer rows.Close()
	for rows.Next() {
		var s topicSample
		if err := rows.Scan(&s.At, &s.Seconds, &s.Appended, &s.Staged, &s.Writer, &h.Now); err != nil {
			return h, fmt.Errorf("console: samples of topic %d: %w", topic, err)
		}
		all = append(all, s)
	}
	if err := rows.Err(); err != nil {
		return h, fmt.Errorf("console: samples of topic %d: %w", topic, err)
	}
	if len(all) > 0 {
		h.Newest = &all[len(all)-1]
	}
	start := h.Now.Add(-chartWindow)
	for _, s := range all {
		if s.At.After(start) {
			h.Samples = append(h.Samples, s)
		}
	}
	return h, nil
}

// groupSamples reads the samples of the window of topic's groups, by
// group (groupSamplesSQL).
func (c *Console) groupSamples(ctx context.Context, topic int) (map[string][]groupSample, error) {
	rows, err := c.pool.Query(ctx, schema.SQL(ctx, groupSamplesSQL), topic, chartWindow.Milliseconds())
	if err != nil {
		return nil, fmt.Errorf("console: samples of topic %d: %w", topic, err)
	}
	defer rows.Close()
	out := map[string][]groupSample{}
	for rows.Next() {
		var (
			g string
			s groupSample
		)
		if err := rows.Scan(&g, &s.At, &s.Seconds, &s.Handled, &s.Lag, &s.LagCapped, &s.LagSeconds, &s.DeadLetters, &s.DeadLettered); err != nil {
			return nil, fmt.Errorf("console: samples of topic %d: %w", topic, err)
		}
		out[g] = append(out[g], s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("console: samples of topic %d: %w", topic, err)
	}
	return out, nil
}

// partitionSamples reads group's samples of the window with their
// partitions' figures (partitionSamplesSQL).
func (c *Console) partitionSamples(ctx context.Context, topic int, group string) ([]groupSample, error) {
	rows, err := c.pool.Query(ctx, schema.SQL(ctx, partitionSamplesSQL), topic, chartWindow.Milliseconds(), group)
	if err != nil {
		return nil, fmt.Errorf("console: samples of group %s: %w", group, err)
	}
	defer rows.Close()
	var out []groupSample
	for rows.Next() {
		var s groupSample
		if err := rows.Scan(&s.At, &s.Seconds, &s.Handled, &s.Lag, &s.LagCapped, &s.LagSeconds, &s.DeadLetters, &s.DeadLettered,
			&s.PartHandled, &s.PartLag, &s.PartLagSeconds); err != nil {
			return nil, fmt.Errorf("console: samples of group %s: %w", group, err)
		}
		out = append(out, s)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("console: samples of group %s: %w", group, err)
	}
	return out, nil
}

// figure is a rate (or a count) read from the samples, with what the
// page says when there is none.
type figure struct {
	V     float64 // the value; meaningful when OK
	OK    bool
	Title string // when !OK: why there is none; when OK: what it covers
}

// noSample is what a figure says before the first sample of a topic.
var noSample = "no sample yet: maintenance writes one every " + human.Duration(pgevents.SamplePeriod) +
	" while a consumer (or consumer maintain) runs"

// emptyChart is what a chart of n samples says when it has nothing to
// draw: no sample yet, or (a rate) only one.
func emptyChart(n int) string {
	if n == 0 {
		return "no sample yet"
	}
	return "one sample so far: a rate needs two"
}

// lastRate is the rate of the newest sample of samples that has one:
// events / seconds since the sample before it.
func lastRate(samples []rateSample) figure {
	for i := len(samples) - 1; i >= 0; i-- {
		s := samples[i]
		if s.events != nil && s.seconds != nil && *s.seconds > 0 {
			return figure{V: float64(*s.events) / *s.seconds, OK: true,
				Title: fmt.Sprintf("%s events in the %s before %s (the last samples)", human.Count(*s.events),
					human.Seconds(*s.seconds), s.at.UTC().Format("15:04:05Z"))}
		}
	}
	if len(samples) == 0 {
		return figure{Title: noSample}
	}
	return figure{Title: "one sample so far: a rate needs the next, within " + human.Duration(pgevents.SamplePeriod)}
}

// lastPartitionRate is lastRate of partition p's events handled.
func lastPartitionRate(ss []groupSample, p int) figure {
	rs := make([]rateSample, len(ss))
	for i, s := range ss {
		rs[i] = rateSample{at: s.At, seconds: s.Seconds}
		if p < len(s.PartHandled) {
			rs[i].events = s.PartHandled[p]
		}
	}
	return lastRate(rs)
}

// rateSample is a sample's events and the seconds they took.
type rateSample struct {
	at      time.Time
	events  *int64
	seconds *float64
}

func topicRates(ss []topicSample) []rateSample {
	out := make([]rateSample, len(ss))
	for i, s := range ss {
		out[i] = rateSample{s.At, s.Appended, s.Seconds}
	}
	return out
}

func groupRates(ss []groupSample) []rateSample {
	out := make([]rateSample, len(ss))
	for i, s := range ss {
		out[i] = rateSample{s.At, s.Handled, s.Seconds}
	}
	return out
}

// staleAfter is how long the newest sample may be old before maintenance
// is shown as not running: three times the usual spacing of the samples
// (maintenance runs every MaintenanceInterval, which a deployment sets),
// and at least minStale.
func staleAfter(ss []topicSample) time.Duration {
	var gaps []time.Duration
	for i := 1; i < len(ss); i++ {
		gaps = append(gaps, ss[i].At.Sub(ss[i-1].At))
	}
	if len(gaps) == 0 {
		return minStale
	}
	slices.Sort(gaps)
	return max(3*gaps[len(gaps)/2], minStale)
}

// verdict says whether a group keeps up, and since when it does not.
type verdict struct {
	Word    string        // keeps up, catching up, falling behind, stalled, behind
	Class   string        // good, warn, bad
	Since   time.Time     // when it fell behind; zero when it keeps up
	For     time.Duration // how long ago that is
	AtLeast bool          // it was behind at the start of the window already
	Title   string
}

// judge reads a group's verdict from its current lag and age (at the
// database time now) and its samples: it keeps up while its oldest
// unhandled event is younger than keepUpAge; otherwise it is behind since
// the first sample of the run of samples (up to now) that were behind, or
// since its oldest unhandled event was appended, whichever is earlier,
// and the last minute of samples says whether it catches up (its lag
// shrinks), falls behind (it grows) or is stalled (it handled nothing).
func judge(lag int64, lagSeconds float64, now time.Time, ss []groupSample) verdict {
	age := time.Duration(lagSeconds * float64(time.Second))
	if lag == 0 || age < keepUpAge {
		return verdict{Word: "keeps up", Class: "good", Title: "its oldest unhandled event is younger than " + human.Duration(keepUpAge)}
	}
	v := verdict{Word: "behind", Class: "bad", Since: now.Add(-age)}
	run := len(ss)
	for run > 0 && time.Duration(ss[run-1].LagSeconds*float64(time.Second)) >= keepUpAge {
		run--
	}
	if run < len(ss) && ss[run].At.Before(v.Since) {
		v.Since = ss[run].At
	}
	v.AtLeast = run == 0 && len(ss) > 0 && !ss[0].At.After(v.Since)
	v.For = now.Sub(v.Since)
	// The last minute: the samples from a minute before the newest.
	var recent []groupSample
	for _, s := range ss {
		if len(ss) > 0 && !s.At.Before(ss[len(ss)-1].At.Add(-time.Minute)) {
			recent = append(recent, s)
		}
	}
	if len(recent) < 2 {
		v.Title = "the oldest unhandled event is " + human.Seconds(lagSeconds) + " old; the samples do not say yet whether the lag grows"
		return v
	}
	var handled int64
	for _, s := range recent[1:] {
		if s.Handled != nil {
			handled += *s.Handled
		}
	}
	first, last := recent[0], recent[len(recent)-1]
	switch {
	case handled == 0:
		v.Word, v.Title = "stalled", "it handled nothing in the last "+human.Duration(last.At.Sub(first.At))+" of samples"
	case last.Lag < first.Lag:
		v.Word, v.Class, v.Title = "catching up", "warn", fmt.Sprintf("its lag went from %s to %s in %s", human.Count(first.Lag),
			human.Count(last.Lag), human.Duration(last.At.Sub(first.At)))
	default:
		v.Word, v.Title = "falling behind", fmt.Sprintf("its lag went from %s to %s in %s", human.Count(first.Lag),
			human.Count(last.Lag), human.Duration(last.At.Sub(first.At)))
	}
	return v
}
