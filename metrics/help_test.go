package metrics_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/metrics"
)

// TestWakeupsHelpNamesEverySource: the help of pgevents_wakeups_total
// names every value of its source label (every pgevents.WakeSource),
// tail, the most frequent while events flow, included.
func TestWakeupsHelpNamesEverySource(t *testing.T) {
	m, err := metrics.New(metrics.Options{Group: "g", Topic: 1, NoRuntimeMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	var sources []string
	for s := pgevents.WakeSource(0); s < 64; s++ {
		if l := s.String(); !slices.Contains(sources, l) {
			sources = append(sources, l)
		}
		m.Woken(0, s) // so that the family is gathered
	}
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var help string
	for _, f := range fams {
		if f.GetName() == "pgevents_wakeups_total" {
			help = f.GetHelp()
		}
	}
	if help == "" {
		t.Fatal("pgevents_wakeups_total is not gathered")
	}
	for _, s := range sources {
		if !strings.Contains(help, " "+s+", ") {
			t.Errorf("the help of pgevents_wakeups_total does not name source %q: %s", s, help)
		}
	}
}
