package console

import (
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pgevents/pgevents/internal/human"
)

// Charts are drawn on the server, as inline SVG: no script, no library,
// nothing fetched, so they work offline and under the pages'
// Content-Security-Policy, and refresh with the page's live elements.
// The time axis is the window (the last hour) up to the database clock;
// each series' points are samples, merged in consecutive runs when there
// are more than the chart's width allows (the rate of a run is its events
// over its seconds; a lag or an age, its largest). Each series carries
// its points as data: data-t, each point's time in milliseconds from the
// chart's right edge (data-end, Unix milliseconds: the database clock when
// the page was read), and data-v, its value (what a test, or a curious
// operator, reads).

// chartKind is what a chart shows, and how its values read.
type chartKind int

const (
	kindRate      chartKind = iota // events per second
	kindCount                      // events
	kindAge                        // seconds
	kindPerMinute                  // dead letters per minute
)

// chartSize is a chart's size in pixels, how many points it draws at
// most, and whether it writes its time axis' ends under it.
type chartSize struct {
	W, H, Points int
	Axis         bool
}

var (
	smallChart = chartSize{W: 130, H: 30, Points: 40}              // a table cell
	wideChart  = chartSize{W: 300, H: 70, Points: 100, Axis: true} // a page's figure
	topicChart = chartSize{W: 240, H: 36, Points: 60, Axis: true}  // a topic's appended events
)

// chartPoint is one point of a series.
type chartPoint struct {
	At time.Time
	V  float64
}

// chartSeries is a series to draw: its name (data-series, and its CSS
// class s-<name>) and points, oldest first. Data says whether the series
// carries its points as data attributes.
type chartSeries struct {
	Name   string
	Points []chartPoint
	Data   bool
}

// chart is what the template "chart" draws.
type chart struct {
	Name  string // data-chart
	Label string // what it shows, for aria-label and the tooltip
	W, H  int
	Paths []chartPath
	Top   string // the value at the top of the y axis
	Empty string // why there is nothing to draw; "" when there is
	EndMS int64  // the right edge, Unix milliseconds (data-end)
	TextY int    // the baseline of the chart's text
	// AxisY is the baseline of the time axis' labels, under the chart;
	// 0: none.
	AxisY int
}

// chartPath is a drawn series.
type chartPath struct {
	Name string
	D    string // SVG path data
	T, V string // data-t and data-v; "" when the series carries none
}

// newChart draws series of kind on the window ending at end, in size.
// empty is what the chart says when no series has a point.
func newChart(name, label string, kind chartKind, size chartSize, end time.Time, empty string, series ...chartSeries) chart {
	c := chart{Name: name, Label: label, W: size.W, H: size.H, EndMS: end.UnixMilli(), TextY: min(size.H/2+4, 11)}
	if size.Axis {
		c.AxisY = size.H + 10
	}
	start := end.Add(-chartWindow)
	top := 0.0
	drawn := false
	for i := range series {
		series[i].Points = merge(series[i].Points, size.Points, kind)
		for _, p := range series[i].Points {
			top = max(top, p.V)
			drawn = true
		}
	}
	if !drawn {
		c.Empty = empty
		return c
	}
	top = niceCeil(top, kind)
	c.Top = axisLabel(top, kind)
	const padTop, padBottom = 10.0, 2.0
	for _, s := range series {
		if len(s.Points) == 0 {
			continue
		}
		gap := gapOf(s.Points)
		var d, ts, vs strings.Builder
		for i, p := range s.Points {
			at := p.At
			if kind == kindPerMinute {
				at = at.Add(30 * time.Second)
			}
			x := float64(size.W) * float64(at.Sub(start)) / float64(chartWindow)
			x = math.Min(math.Max(x, 0), float64(size.W))
			y := float64(size.H) - padBottom - p.V/top*(float64(size.H)-padTop-padBottom)
			if s.Data {
				if i > 0 {
					ts.WriteByte(' ')
					vs.WriteByte(' ')
				}
				ts.WriteString(strconv.FormatInt(p.At.UnixMilli()-c.EndMS, 10))
				vs.WriteString(strconv.FormatFloat(p.V, 'g', 6, 64))
			}
			if kind == kindPerMinute { // a bar per minute; none for 0
				if p.V > 0 {
					if d.Len() > 0 {
						d.WriteByte(' ')
					}
					d.WriteString("M" + fmtCoord(x) + " " + fmtCoord(float64(size.H)) + "V" + fmtCoord(y))
				}
				continue
			}
			if i > 0 {
				d.WriteByte(' ')
			}
			first := i == 0 || p.At.Sub(s.Points[i-1].At) > gap
			last := i+1 == len(s.Points) || s.Points[i+1].At.Sub(p.At) > gap
			if first {
				d.WriteByte('M')
			} else {
				d.WriteByte('L')
			}
			d.WriteString(fmtCoord(x) + " " + fmtCoord(y))
			if first && last { // a lone point: a short stroke to see it by
				d.WriteString(" h-2")
			}
		}
		c.Paths = append(c.Paths, chartPath{Name: s.Name, D: d.String(), T: ts.String(), V: vs.String()})
	}
	return c
}

// merge merges consecutive points into runs so that at most n remain: a
// rate is averaged over the run (its points are spaced alike), a count or
// an age takes the run's largest, a per-minute figure its sum; a run is
// dated by its last point.
func merge(ps []chartPoint, n int, kind chartKind) []chartPoint {
	if len(ps) <= n || n <= 0 {
		return ps
	}
	k := (len(ps) + n - 1) / n
	out := make([]chartPoint, 0, n)
	for i := 0; i < len(ps); i += k {
		run := ps[i:min(i+k, len(ps))]
		v := 0.0
		for _, p := range run {
			switch kind {
			case kindRate:
				v += p.V / float64(len(run))
			case kindPerMinute:
				v += p.V
			default:
				v = max(v, p.V)
			}
		}
		out = append(out, chartPoint{At: run[len(run)-1].At, V: v})
	}
	return out
}

// gapOf is the time between two points past which the line breaks (no
// sample meanwhile: maintenance did not run): three times their usual
// spacing.
func gapOf(ps []chartPoint) time.Duration {
	if len(ps) < 3 {
		return chartWindow
	}
	gaps := make([]time.Duration, 0, len(ps)-1)
	for i := 1; i < len(ps); i++ {
		gaps = append(gaps, ps[i].At.Sub(ps[i-1].At))
	}
	sort.Slice(gaps, func(i, j int) bool { return gaps[i] < gaps[j] })
	return 3 * gaps[len(gaps)/2]
}

// niceCeil is the smallest of 1, 2, 5 times a power of ten at or above v,
// and at least: a rate or a per-minute figure, 1; an age, 10 s (the age
// under which a group keeps up); a lag, 100 events (a lag of a few events
// is no lag: it is drawn flat).
func niceCeil(v float64, kind chartKind) float64 {
	floor := map[chartKind]float64{kindRate: 1, kindPerMinute: 1, kindAge: keepUpAge.Seconds(), kindCount: 100}[kind]
	if v <= floor {
		return floor
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// axisLabel writes the top of a chart's axis.
func axisLabel(v float64, kind chartKind) string {
	switch kind {
	case kindRate:
		return human.Rate(v)
	case kindAge:
		return human.Seconds(v)
	case kindPerMinute:
		return human.Count(int64(v)) + "/min"
	}
	return human.Count(int64(v))
}

func fmtCoord(v float64) string { return strconv.FormatFloat(math.Round(v*10)/10, 'f', -1, 64) }

// ratePoints are the rates of samples: each sample's events over the
// seconds since the sample before it (none for a sample without).
func ratePoints(ss []rateSample) []chartPoint {
	var out []chartPoint
	for _, s := range ss {
		if s.events != nil && s.seconds != nil && *s.seconds > 0 {
			out = append(out, chartPoint{At: s.at, V: float64(*s.events) / *s.seconds})
		}
	}
	return out
}

// groupPoints are one figure of a group's samples.
func groupPoints(ss []groupSample, f func(groupSample) (float64, bool)) []chartPoint {
	var out []chartPoint
	for _, s := range ss {
		if v, ok := f(s); ok {
			out = append(out, chartPoint{At: s.At, V: v})
		}
	}
	return out
}

func lagOf(s groupSample) (float64, bool) { return float64(s.Lag), true }
func ageOf(s groupSample) (float64, bool) { return s.LagSeconds, true }

// deadPerMinute is the dead letters written in each minute (UTC) of the
// samples, by the time each sample was taken (what a sample counts since
// the one before it): a point per minute that has a sample, dated by the
// minute's start; its bar is drawn in the minute's middle.
func deadPerMinute(ss []groupSample) []chartPoint {
	var out []chartPoint
	for _, s := range ss {
		if s.DeadLettered == nil {
			continue
		}
		m := s.At.UTC().Truncate(time.Minute)
		if n := len(out); n > 0 && out[n-1].At.Equal(m) {
			out[n-1].V += float64(*s.DeadLettered)
			continue
		}
		out = append(out, chartPoint{At: m, V: float64(*s.DeadLettered)})
	}
	return out
}

// partitionRates are partition p's handling rates in samples.
func partitionRates(ss []groupSample, p int) []chartPoint {
	var out []chartPoint
	for _, s := range ss {
		if p < len(s.PartHandled) && s.PartHandled[p] != nil && s.Seconds != nil && *s.Seconds > 0 {
			out = append(out, chartPoint{At: s.At, V: float64(*s.PartHandled[p]) / *s.Seconds})
		}
	}
	return out
}

// partitionLags are partition p's lags in samples.
func partitionLags(ss []groupSample, p int) []chartPoint {
	var out []chartPoint
	for _, s := range ss {
		if p < len(s.PartLag) {
			out = append(out, chartPoint{At: s.At, V: float64(s.PartLag[p])})
		}
	}
	return out
}
