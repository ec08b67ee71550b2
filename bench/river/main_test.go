package main

import (
	"bytes"
	"errors"
	"flag"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestPercentiles checks the percentile rule the bench uses: the element
// at index ⌊p·n⌋ of the sorted values, the last one at most.
func TestPercentiles(t *testing.T) {
	var d durations
	for i := 100; i >= 1; i-- { // added out of order
		d.add(time.Duration(i) * time.Millisecond)
	}
	got := d.percentiles(0.5, 0.99, 0.999, 1)
	if want := []float64{51, 100, 100, 100}; !slices.Equal(got, want) {
		t.Fatalf("percentiles %v, want %v", got, want)
	}
	var empty durations
	if got := empty.percentiles(0.5, 0.99); !slices.Equal(got, []float64{0, 0}) {
		t.Fatalf("no durations: %v", got)
	}
}

// TestMarks checks that a job's latency runs from its producer's COMMIT
// returned (or its call) to its handler's first start, and that jobs
// marked only one way are left out.
func TestMarks(t *testing.T) {
	m := newMarks()
	t0 := time.Now()
	for i := range int64(10) {
		tx := txTimes{began: t0, done: t0.Add(time.Millisecond)}
		m.committed([]int64{i}, tx)
		m.handled(i, t0.Add(time.Duration(i+2)*time.Millisecond))
		m.handled(i, t0.Add(time.Hour)) // a second start does not count
	}
	m.committed([]int64{99}, txTimes{began: t0, done: t0}) // never handled
	m.handled(77, t0.Add(time.Hour))                       // never committed (the warm-up's)
	if got, want := m.percentiles(false, 0.5, 0.99), []float64{6, 10}; !slices.Equal(got, want) {
		t.Fatalf("from COMMIT: %v, want %v", got, want)
	}
	if got, want := m.percentiles(true, 0.5), []float64{7}; !slices.Equal(got, want) {
		t.Fatalf("from the call: %v, want %v", got, want)
	}
	if n := m.handledCount(); n != 11 {
		t.Fatalf("handled %d, want 11", n)
	}
	m.reset()
	if n := m.handledCount(); n != 0 {
		t.Fatalf("after reset: %d handled", n)
	}
}

// TestScheduleSummary checks that a transaction is on schedule when it
// committed within one producer interval of its scheduled time.
func TestScheduleSummary(t *testing.T) {
	s := &schedule{interval: 4 * time.Millisecond}
	due := time.Now()
	for _, late := range []time.Duration{1, 4, 5, 100} {
		s.add(txTimes{due: due, done: due.Add(late * time.Millisecond)})
	}
	onTime, p99 := s.summary()
	if onTime != 2 || p99 != 100 {
		t.Fatalf("on time %d, p99 %v ms; want 2 and 100", onTime, p99)
	}
}

// TestParseOptions checks the command line: -h prints the usage to stdout
// and asks to exit 0; a bad one is a usage error (exit 2) naming the
// flag.
func TestParseOptions(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://localhost/db")
	var stdout, stderr bytes.Buffer
	if _, err := parseOptions([]string{"-h"}, &stdout, &stderr); !errors.Is(err, flag.ErrHelp) || !strings.Contains(stdout.String(), "-fetch-cooldown") || stderr.Len() > 0 {
		t.Fatalf("-h: %v; stdout %q, stderr %q", err, stdout.String(), stderr.String())
	}
	o, err := parseOptions([]string{"-mode", "schedule", "-rate", "3000", "-producers", "16"}, &stdout, &stderr)
	if err != nil || o.mode != "schedule" || o.rate != 3000 || o.producers != 16 || o.url != "postgres://localhost/db" ||
		o.fetchCooldown != time.Millisecond || o.fetchPollInterval != time.Millisecond || o.maxWorkers != 100 {
		t.Fatalf("options %+v, %v", o, err)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{}, "-mode"},
		{[]string{"-mode", "fast"}, `"fast"`},
		{[]string{"-mode", "drain", "-jobs", "0"}, "-jobs"},
		{[]string{"-mode", "latency", "-producers", "0"}, "-producers"},
		{[]string{"-mode", "latency", "extra"}, `"extra"`},
		{[]string{"-bogus"}, "-bogus"},
	} {
		if _, err := parseOptions(bad.args, &stdout, &stderr); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: %v, want a usage error naming %s", bad.args, err, bad.want)
		}
	}
	t.Setenv("DATABASE_URL", "")
	if _, err := parseOptions([]string{"-mode", "latency"}, &stdout, &stderr); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "DATABASE_URL") {
		t.Errorf("no database: %v", err)
	}
}
