package bench

import (
	"maps"
	"math"
	"strings"
	"testing"
	"time"
)

// TestBenchParseRiverLine checks that the River program's lines are read
// as they are written, and that anything else is refused with an error
// that quotes it.
func TestBenchParseRiverLine(t *testing.T) {
	l, err := benchParseRiverLine([]byte(`{"type":"mark","mark":"start"}`))
	if err != nil || l.Type != "mark" || l.Mark != "start" {
		t.Fatalf("start mark: %+v, %v", l, err)
	}
	if l, err := benchParseRiverLine([]byte(`{"type":"mark","mark":"end"}` + "\n")); err != nil || l.Mark != "end" {
		t.Fatalf("end mark: %+v, %v", l, err)
	}
	latency := `{"type":"result","mode":"latency","river":"v0.51.2","seconds":10.2,"jobs":11000,"handled":10000,"offered":10000,` +
		`"committed":10000,"on_schedule":9990,"late_p99_ms":3.5,"commit_to_handler_ms":[2.1,9.7,15],"call_to_handler_ms":[4.5,20,30],"tx_ms":[2.6,10.7]}`
	l, err = benchParseRiverLine([]byte(latency))
	if err != nil {
		t.Fatal(err)
	}
	if l.Mode != "latency" || l.River != "v0.51.2" || l.Handled != 10000 || l.Offered != 10000 || l.OnSchedule != 9990 ||
		l.CommitToHandlerMs[1] != 9.7 || l.CallToHandlerMs[0] != 4.5 || l.TxMs[1] != 10.7 {
		t.Fatalf("latency result read as %+v", l)
	}
	w := l.window(benchPeersReading{}, benchPeersReading{}, nil)
	if w.commit != [2]float64{2.1, 9.7} || w.call != [2]float64{4.5, 20} || w.tx != [2]float64{2.6, 10.7} ||
		w.offered != 10000 || w.committed != 10000 || w.onTime != 9990 || w.events != 10000 {
		t.Fatalf("latency window %+v", w)
	}
	l, err = benchParseRiverLine([]byte(`{"type":"result","mode":"drain","river":"v0.51.2","seconds":2,"jobs":50000,"handled":50000,"rate":25000}`))
	if err != nil || l.Rate != 25000 || l.Jobs != 50000 {
		t.Fatalf("drain result: %+v, %v", l, err)
	}
	if w := l.window(benchPeersReading{}, benchPeersReading{}, nil); w.drainRate != 25000 || w.events != 50000 {
		t.Fatalf("drain window %+v", w)
	}

	for _, bad := range []struct{ line, want string }{
		{`go: downloading github.com/riverqueue/river v0.51.2`, "unexpected output"},
		{``, "unexpected output"},
		{`{"type":"mark","mark":"start"}{"type":"mark","mark":"end"}`, "more than one object"},
		{`{"type":"mark","mark":"middle"}`, `unknown mark "middle"`},
		{`{"type":"progress"}`, "no type mark or result"},
		{`{"type":"mark","mark":"start","extra":1}`, `unknown field "extra"`},
		{`{"type":"result","mode":"latency","offered":10,"commit_to_handler_ms":[1,2,3],"call_to_handler_ms":[1,2,3]}`, "without its percentiles"},
		{`{"type":"result","mode":"schedule","commit_to_handler_ms":[1,2,3],"call_to_handler_ms":[1,2,3],"tx_ms":[1,2]}`, "without the transactions offered"},
		{`{"type":"result","mode":"drain","jobs":10}`, "drain result without its rate"},
		{`{"type":"result","mode":"burst"}`, `unknown mode "burst"`},
	} {
		if _, err := benchParseRiverLine([]byte(bad.line)); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: error %v, want one saying %q", bad.line, err, bad.want)
		}
	}
}

// TestBenchPeersResults checks the rows of the peers case: one per system
// and measure, the ratios of pgevents over each peer taken per repetition
// and then their median, the targets, and a skipped peer's rows saying so.
func TestBenchPeersResults(t *testing.T) {
	measures := []benchPeersMeasure{
		{name: "CPU per event", unit: "µs", riverRatio: 0.7, note: "how CPU is counted", foreign: true},
		{name: "committed / offered", unit: "ratio", atLeast: 0.99},
	}
	systems := []benchPeersFigures{
		{name: "pgevents", pgevents: true, how: "pgevents how", runs: [][]float64{{2000, 4000, 3000}, {1, 0.5, 0.98}},
			foreign: [][]float64{{0.1, 0.3, 0.2}, {0.5, 0.5, 0.5}}},
		{name: "River", how: "River how", runs: [][]float64{{1000, 1000, 2000}, {1, 1, 1}}},
		{name: "PgQ", how: "PgQ how", skipped: "the pgq extension is not installed", runs: [][]float64{nil, nil}},
	}
	rs := benchPeersResults(measures, systems, "run note")
	var names []string
	for _, r := range rs {
		names = append(names, r.Name)
	}
	want := []string{
		"CPU per event: pgevents", "CPU per event: River", "CPU per event: PgQ",
		"CPU per event: pgevents / River", "CPU per event: pgevents / PgQ",
		"committed / offered: pgevents", "committed / offered: River", "committed / offered: PgQ",
		"committed / offered: pgevents / River", "committed / offered: pgevents / PgQ",
	}
	if strings.Join(names, "|") != strings.Join(want, "|") {
		t.Fatalf("rows:\n%s\nwant:\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	for _, r := range rs {
		if r.Case != "peers" {
			t.Errorf("%s: case %q", r.Name, r.Case)
		}
	}
	// Per repetition 2, 4 and 1.5: the median of the ratios, not the ratio
	// of the medians (3000 / 1000).
	if r := rs[3]; r.Median != 2 || r.Unit != "ratio" || r.Target != "≤ 0.70" || r.Met == nil || *r.Met {
		t.Errorf("CPU ratio row %+v", r)
	}
	if r := rs[0]; r.Median != 3000 || !strings.Contains(r.Note, "pgevents how") || !strings.Contains(r.Note, "run note") || !strings.Contains(r.Note, "how CPU is counted") ||
		!strings.Contains(r.Note, "other processes kept the machine 20% busy during the windows of pgevents") {
		t.Errorf("first row %+v", r)
	}
	if r := rs[1]; !strings.Contains(r.Note, "River how") || strings.Contains(r.Note, "run note") || r.Target != "" {
		t.Errorf("River's first row %+v", r)
	}
	if r := rs[2]; !math.IsNaN(r.Median) || len(r.Runs) != 0 || !strings.Contains(r.Note, "PgQ not measured: the pgq extension is not installed") {
		t.Errorf("skipped PgQ row %+v", r)
	}
	if r := rs[4]; !math.IsNaN(r.Median) || !strings.Contains(r.Note, "PgQ not measured") || r.Target != "" {
		t.Errorf("ratio to the skipped PgQ %+v", r)
	}
	if r := rs[5]; r.Median != 0.98 || r.Target != "≥ 0.99" || r.Met == nil || *r.Met || strings.Contains(r.Note, "other processes") {
		t.Errorf("pgevents' own target %+v", r)
	}
	if r := rs[6]; r.Target != "" || r.Met != nil {
		t.Errorf("River's row has a target: %+v", r)
	}
	if r := rs[8]; r.Target != "" || r.Median != 0.98 {
		t.Errorf("ratio without a target %+v", r)
	}
}

// TestBenchPeersWindowSetCPU checks the CPU per event of a window: the
// machine's busy time, and the bench's own processes' (itself, the River
// program, the server), each over the events handled; and its split by
// part: the sessions' CPU by part, the bench process, the River program.
func TestBenchPeersWindowSetCPU(t *testing.T) {
	at := time.Now()
	r0 := benchPeersReading{cpu: benchCPU{machineIdle: 30 * time.Second, cpus: 2, statAt: at, server: 3 * time.Second, self: 2 * time.Second, at: at},
		child: time.Second}
	r1 := benchPeersReading{cpu: benchCPU{machineIdle: 34 * time.Second, cpus: 2, statAt: at.Add(10 * time.Second), server: 8 * time.Second, self: 4 * time.Second,
		at: at.Add(10 * time.Second)}, child: 6 * time.Second}
	sessions := map[string]time.Duration{"producers' sessions": 3 * time.Second, "watcher's session": 0, "sequencer's session": 800 * time.Millisecond}
	var w benchPeersWindow
	w.setCPU(r0, r1, sessions, 8000)
	// The cores' 20 s less 4 s idle: busy 16 s; own 2 + 5 + 5 = 12 s;
	// other processes 4 s.
	if w.events != 8000 || w.seconds != 10 || w.machineUS != 2000 || w.ownUS != 1500 || w.busy != 0.8 || w.foreign != 0.2 {
		t.Fatalf("window %+v", w)
	}
	want := map[string]float64{"producers' sessions": 375, "watcher's session": 0, "sequencer's session": 100, "bench process": 250, "River program": 625}
	if !maps.Equal(w.parts, want) {
		t.Fatalf("parts %v, want %v", w.parts, want)
	}
	if got := w.partsText(); got != "River program 625 µs, producers' sessions 375 µs, bench process 250 µs, sequencer's session 100 µs" {
		t.Fatalf("parts text %q", got)
	}
	if got := benchMedianParts([]map[string]float64{{"a": 1, "b": 5}, {"a": 3}, {"a": 2, "b": 7}}); !maps.Equal(got, map[string]float64{"a": 2, "b": 5}) {
		t.Fatalf("median parts %v", got)
	}
	w = benchPeersWindow{}
	w.setCPU(r0, r0, nil, 0)
	if w.machineUS != 0 || w.ownUS != 0 || w.busy != 0 {
		t.Fatalf("empty window %+v", w)
	}
}

// TestBenchCPUMachine checks the machine's busy time between two
// readings: the cores' time less their idle time, nothing when /proc/stat
// was not read, and on this machine no more than the cores' time.
func TestBenchCPUMachine(t *testing.T) {
	at := time.Now()
	a := benchCPU{machineIdle: time.Second, cpus: 4, statAt: at}
	b := benchCPU{machineIdle: 3 * time.Second, cpus: 4, statAt: at.Add(time.Second)}
	if busy, all := b.machine(a); busy != 2*time.Second || all != 4*time.Second {
		t.Fatalf("busy %s of %s, want 2s of 4s", busy, all)
	}
	if d := b.since(a); d.busy != 0.5 {
		t.Fatalf("since: busy %v, want 0.5", d.busy)
	}
	if busy, all := b.machine(benchCPU{}); busy != 0 || all != 0 {
		t.Fatalf("without a first reading: %s of %s", busy, all)
	}
	r0 := readBenchCPU(0)
	if r0.cpus == 0 {
		t.Skip("no /proc/stat")
	}
	time.Sleep(50 * time.Millisecond)
	busy, all := readBenchCPU(0).machine(r0)
	if all < time.Duration(r0.cpus)*50*time.Millisecond || busy > all {
		t.Fatalf("%d cores over 50 ms: busy %s of %s", r0.cpus, busy, all)
	}
}

// TestBenchRiverDir checks that the River program's module is found from
// inside the repository (tests run in this package's folder), that
// --river must name it, and that River's version is read from its go.mod.
func TestBenchRiverDir(t *testing.T) {
	dir, err := benchRiverDir("")
	if err != nil {
		t.Fatal(err)
	}
	if !benchIsRiverModule(dir) || !strings.HasSuffix(dir, "bench/river") {
		t.Fatalf("found %s", dir)
	}
	if v := benchRiverVersion(dir); !strings.HasPrefix(v, "v0.") {
		t.Fatalf("River version %q in %s/go.mod", v, dir)
	}
	if d, err := benchRiverDir(dir); err != nil || d != dir {
		t.Fatalf("--river %s: %s, %v", dir, d, err)
	}
	if _, err := benchRiverDir(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no go.mod of module "+benchRiverModule) {
		t.Fatalf("--river of an empty folder: %v", err)
	}
}
