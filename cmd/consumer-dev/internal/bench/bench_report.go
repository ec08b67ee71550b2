package bench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// benchResult is one figure of the report: the median of its runs.
type benchResult struct {
	Case   string    `json:"case"`
	Name   string    `json:"name"`
	Median float64   `json:"median"`
	Unit   string    `json:"unit"`
	Runs   []float64 `json:"runs"`
	Target string    `json:"target,omitempty"`
	Met    *bool     `json:"met,omitempty"`
	Note   string    `json:"note,omitempty"`
}

// newBenchResult returns the result of runs, whose median it quotes.
func newBenchResult(caseName, name, unit string, runs []float64) benchResult {
	return benchResult{Case: caseName, Name: name, Unit: unit, Runs: runs, Median: benchMedian(runs)}
}

// atLeast sets the target "≥ t" and whether the median meets it.
func (r benchResult) atLeast(t float64) benchResult {
	met := r.Median >= t
	r.Target, r.Met = "≥ "+benchFormat(t), &met
	return r
}

// atMost sets the target "≤ t" and whether the median meets it.
func (r benchResult) atMost(t float64) benchResult {
	met := r.Median <= t
	r.Target, r.Met = "≤ "+benchFormat(t), &met
	return r
}

// noted appends a note to the result.
func (r benchResult) noted(format string, args ...any) benchResult {
	s := fmt.Sprintf(format, args...)
	if r.Note != "" {
		r.Note += "; " + s
	} else {
		r.Note = s
	}
	return r
}

// benchHeader describes the run: mode, server, durability settings and
// machine.
type benchHeader struct {
	Mode        string            `json:"mode"`
	Repetitions int               `json:"repetitions"`
	Server      string            `json:"server"`
	Where       string            `json:"where"`
	Settings    map[string]string `json:"settings"`
	CPUs        int               `json:"cpus"`
	MemoryMiB   int64             `json:"memory_mib"`
	Go          string            `json:"go"`
	Started     time.Time         `json:"started"`
	Elapsed     string            `json:"elapsed"`
}

// benchSettingNames are the server settings the header reports, in order.
var benchSettingNames = []string{
	"fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "wal_level",
	"shared_buffers", "max_wal_size", "checkpoint_timeout", "max_connections", "track_commit_timestamp",
}

// benchReport is what `consumer bench` prints.
type benchReport struct {
	Header  benchHeader        `json:"header"`
	Results []benchResult      `json:"results"`
	Cases   []benchCaseSummary `json:"cases"`
	Errors  []string           `json:"errors,omitempty"`
}

// benchCaseSummary says how long a case took and what the server did
// meanwhile.
type benchCaseSummary struct {
	Case    string              `json:"case"`
	Seconds float64             `json:"seconds"`
	Server  benchServerActivity `json:"server"`
	Busy    float64             `json:"machine_busy"` // fraction of all cores
	Foreign float64             `json:"foreign_busy"` // of which neither bench nor server
}

// writeTable prints the report as aligned text: the header, one row per
// result, then the notes the rows point to.
func (rep *benchReport) writeTable(w io.Writer) error {
	h := &rep.Header
	var b strings.Builder
	fmt.Fprintf(&b, "pgevents bench: %s mode, %d repetition(s) per figure; MEDIAN is their median, RUNS their range; took %s\n",
		h.Mode, h.Repetitions, h.Elapsed)
	fmt.Fprintf(&b, "server: %s (%s)\n", h.Server, h.Where)
	settings := make([]string, 0, len(benchSettingNames))
	for _, k := range benchSettingNames {
		if v, ok := h.Settings[k]; ok {
			settings = append(settings, k+"="+v)
		}
	}
	fmt.Fprintf(&b, "settings: %s (server defaults: durable commits)\n", strings.Join(settings, " "))
	fmt.Fprintf(&b, "machine: %d CPUs, %d MiB RAM, %s; bench, consumer and server share the machine\n\n", h.CPUs, h.MemoryMiB, h.Go)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tMEASUREMENT\tMEDIAN\tUNIT\tRUNS\tTARGET\tMET\tNOTE")
	var notes []string
	for _, r := range rep.Results {
		met := ""
		if r.Met != nil {
			met = map[bool]string{true: "yes", false: "NO"}[*r.Met]
		}
		ref := ""
		if r.Note != "" {
			notes = append(notes, r.Note)
			ref = fmt.Sprintf("[%d]", len(notes))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Case, r.Name, benchFormat(r.Median), r.Unit,
			benchRange(r.Runs), r.Target, met, ref)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b.Reset()
	if len(notes) > 0 {
		b.WriteString("\nnotes:\n")
		for i, n := range notes {
			fmt.Fprintf(&b, "[%d] %s\n", i+1, n)
		}
	}
	if len(rep.Cases) > 0 {
		b.WriteString("\ncases (machine CPU busy, and the part used by other processes than the bench and its server;\n" +
			"server activity; checkpoints include those forced by DROP DATABASE between measurements):\n")
		for _, c := range rep.Cases {
			fmt.Fprintf(&b, "%-10s %4.0f s, CPU %3.0f%% busy (%2.0f%% other processes), %d checkpoints, %.2f GiB WAL, %d buffers written by backends\n",
				c.Case, c.Seconds, 100*c.Busy, 100*c.Foreign, c.Server.Checkpoints, float64(c.Server.WALBytes)/(1<<30), c.Server.BackendWrites)
		}
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(&b, "\nERROR %s\n", e)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// benchRange formats the spread of runs as "min..max", or the single run.
func benchRange(runs []float64) string {
	if len(runs) == 0 {
		return "-"
	}
	lo, hi := slices.Min(runs), slices.Max(runs)
	if len(runs) == 1 || lo == hi {
		return benchFormat(lo)
	}
	return benchFormat(lo) + ".." + benchFormat(hi)
}

// benchFormat formats a figure with as many digits as it deserves:
// thousands separators for large numbers, decimals for small ones.
func benchFormat(v float64) string {
	switch a := math.Abs(v); {
	case math.IsNaN(v):
		return "-"
	case a >= 10000:
		s := strconv.FormatInt(int64(math.Round(v)), 10)
		neg := strings.HasPrefix(s, "-")
		s = strings.TrimPrefix(s, "-")
		var out []byte
		for i := range len(s) {
			if i > 0 && (len(s)-i)%3 == 0 {
				out = append(out, ',')
			}
			out = append(out, s[i])
		}
		if neg {
			return "-" + string(out)
		}
		return string(out)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 0.1 || a == 0:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'f', 3, 64)
	}
}

// benchMedian returns the median of xs, NaN when xs is empty.
func benchMedian(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 1 {
		return s[n/2]
	} else {
		return (s[n/2-1] + s[n/2]) / 2
	}
}
