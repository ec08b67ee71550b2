package console

import (
	"strings"
	"testing"
	"time"
)

// TestJudge: a group keeps up while its oldest unhandled event is younger
// than keepUpAge; otherwise the last minute of samples says whether it
// catches up, falls behind or is stalled, and it is behind since the
// first sample of the run of samples that were behind (or its oldest
// unhandled event's creation, when earlier), at least since the window's
// start when every sample was behind.
func TestJudge(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 1, 31, 12, 0, 0, 0, time.UTC)
	n := func(v int64) *int64 { return &v }
	// samples every 10 s up to now, the last len(lags) of them given.
	series := func(ages []float64, lags []int64, handled []int64) []groupSample {
		var out []groupSample
		for i := range lags {
			at := now.Add(-time.Duration(len(lags)-1-i) * 10 * time.Second)
			out = append(out, groupSample{At: at, Lag: lags[i], LagSeconds: ages[i], Handled: n(handled[i])})
		}
		return out
	}
	behind := []float64{1, 1, 30, 40, 50, 60, 70, 80}
	for _, c := range []struct {
		name     string
		lag      int64
		age      float64
		ss       []groupSample
		word     string
		since    time.Duration // before now; 0: none
		atLeast  bool
		titleHas string
	}{
		{"no lag", 0, 0, nil, "keeps up", 0, false, "younger than 10 s"},
		{"young lag", 40, 9.9, nil, "keeps up", 0, false, ""},
		{"no samples", 40, 90, nil, "behind", 90 * time.Second, false, "do not say yet"},
		{"falling behind", 900, 80, series(behind, []int64{0, 0, 100, 200, 300, 400, 500, 600}, []int64{5, 5, 5, 5, 5, 5, 5, 5}),
			"falling behind", 80 * time.Second, false, "from 0 to 600 in 1 m"},
		{"catching up", 900, 80, series(behind, []int64{0, 1000, 900, 800, 700, 600, 500, 400}, []int64{5, 5, 5, 5, 5, 5, 5, 5}),
			"catching up", 80 * time.Second, false, "from 1,000 to 400 in 1 m"},
		{"stalled", 900, 80, series(behind, []int64{0, 0, 100, 200, 300, 400, 500, 600}, []int64{5, 5, 0, 0, 0, 0, 0, 0}),
			"stalled", 80 * time.Second, false, "handled nothing"},
		{"behind since the run's start", 900, 20, series([]float64{1, 30, 30, 30, 30, 30, 30, 30}, []int64{0, 5, 5, 5, 5, 5, 5, 5},
			[]int64{5, 5, 5, 5, 5, 5, 5, 5}), "falling behind", 60 * time.Second, false, ""},
		{"behind the whole window", 900, 20, series([]float64{30, 30, 30}, []int64{5, 5, 5}, []int64{5, 5, 5}),
			"falling behind", 20 * time.Second, true, ""},
	} {
		v := judge(c.lag, c.age, now, c.ss)
		var since time.Duration
		if !v.Since.IsZero() {
			since = now.Sub(v.Since)
		}
		if v.Word != c.word || since != c.since || v.AtLeast != c.atLeast || !strings.Contains(v.Title, c.titleHas) || since != v.For {
			t.Errorf("%s: %+v; want %q since %s before now (at least: %v), a title with %q", c.name, v, c.word, c.since, c.atLeast, c.titleHas)
		}
	}
}

// TestMerge: more samples than a chart's points are merged into runs: a
// rate averaged, a lag at its largest, dead letters summed; each run
// dated by its last sample.
func TestMerge(t *testing.T) {
	t.Parallel()
	start := time.Date(2025, 1, 31, 12, 0, 0, 0, time.UTC)
	var ps []chartPoint
	for i := range 360 {
		ps = append(ps, chartPoint{At: start.Add(time.Duration(i) * 10 * time.Second), V: float64(i % 4)})
	}
	for kind, want := range map[chartKind]float64{kindRate: 1.5, kindCount: 3, kindAge: 3, kindPerMinute: 6} {
		got := merge(ps, 90, kind)
		if len(got) != 90 || got[0].V != want || !got[0].At.Equal(ps[3].At) || !got[89].At.Equal(ps[359].At) {
			t.Errorf("kind %d: %d points, the first %+v; want 90, the first %g at %v", kind, len(got), got[0], want, ps[3].At)
		}
	}
	if got := merge(ps[:50], 90, kindRate); len(got) != 50 {
		t.Errorf("50 points merged into %d for a chart of 90", len(got))
	}
}
