package batching_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/pgevents/pgevents/batching"
)

// ev is a test event; Off is its partition offset (its index in the log).
type ev struct {
	Off  int64
	Tx   int64
	Host string
	User string
}

var keys = batching.Keys[ev]{
	TxID: func(e *ev) int64 { return e.Tx },
	Host: func(e *ev) string { return e.Host },
	User: func(e *ev) string { return e.User },
}

// mk builds a log from transaction ids; offsets are 0, 1, 2, ...
func mk(txs ...int64) []ev {
	out := make([]ev, len(txs))
	for i, tx := range txs {
		out[i] = ev{Off: int64(i), Tx: tx, Host: "h", User: "u"}
	}
	return out
}

func TestCut(t *testing.T) {
	tests := []struct {
		name       string
		rows       []ev
		batchSize  int
		wantN      int
		wantExtend bool
		wantMore   bool
	}{
		{"empty", nil, 3, 0, false, false},
		{"fewer than batchSize", mk(1, 1), 3, 2, false, false},
		{"one row", mk(7), 1, 1, false, false},
		{"exactly batchSize", mk(1, 2, 2), 3, 3, false, false},
		{"exactly batchSize one tx", mk(1, 1, 1), 3, 3, false, false},
		{"batchSize+1 at boundary", mk(1, 2, 2, 3), 3, 3, false, true},
		{"batchSize+1 same tx", mk(1, 2, 2, 2), 3, 1, false, true}, // tx 2 starts the next batch
		{"batchSize+1 same tx from the start", mk(2, 2, 2, 2), 3, 4, true, false},
		{"batchSize+1 all one tx", mk(5, 5, 5, 5), 3, 4, true, false},
		{"batchSize 1 boundary", mk(1, 2), 1, 1, false, true},
		{"batchSize 1 same tx", mk(1, 1), 1, 2, true, false},
		{"over-fetch ignored, boundary", mk(1, 2, 3, 3, 3), 2, 2, false, true},
		{"over-fetch ignored, same tx", mk(1, 2, 2, 2, 2), 2, 1, false, true},
		{"over-fetch ignored, one tx", mk(2, 2, 2, 2, 2), 2, 3, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, extend, more := batching.Cut(keys, tc.rows, tc.batchSize)
			if n != tc.wantN || extend != tc.wantExtend || more != tc.wantMore {
				t.Fatalf("Cut(%v, %d) = (%d, %v, %v), want (%d, %v, %v)",
					txs(tc.rows), tc.batchSize, n, extend, more, tc.wantN, tc.wantExtend, tc.wantMore)
			}
		})
	}
}

func TestContinue(t *testing.T) {
	tests := []struct {
		name       string
		txID       int64
		rows       []ev
		chunk      int
		wantN      int
		wantExtend bool
		wantMore   bool
	}{
		{"empty: tx ended, caught up", 1, nil, 3, 0, false, false},
		{"next tx immediately", 1, mk(2, 2), 3, 0, false, true},
		{"tx ends inside chunk", 1, mk(1, 1, 2), 3, 2, false, true},
		{"tx ends at peek position", 1, mk(1, 1, 1, 2), 3, 3, false, true},
		{"tx fills chunk+1", 1, mk(1, 1, 1, 1), 3, 4, true, false},
		{"short fetch all tx", 1, mk(1, 1), 3, 2, false, false},
		{"exactly chunk all tx", 1, mk(1, 1, 1), 3, 3, false, false},
		{"chunk 1 extend", 4, mk(4, 4), 1, 2, true, false},
		{"chunk 1 end", 4, mk(4, 5), 1, 1, false, true},
		{"over-fetch ignored", 1, mk(1, 1, 1, 1, 1, 2), 2, 3, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n, extend, more := batching.Continue(keys, tc.txID, tc.rows, tc.chunk)
			if n != tc.wantN || extend != tc.wantExtend || more != tc.wantMore {
				t.Fatalf("Continue(%d, %v, %d) = (%d, %v, %v), want (%d, %v, %v)",
					tc.txID, txs(tc.rows), tc.chunk, n, extend, more, tc.wantN, tc.wantExtend, tc.wantMore)
			}
		})
	}
}

func TestPanics(t *testing.T) {
	for name, f := range map[string]func(){
		"Cut 0":       func() { batching.Cut(keys, mk(1), 0) },
		"Cut -1":      func() { batching.Cut(keys, nil, -1) },
		"Continue 0":  func() { batching.Continue(keys, 1, mk(1), 0) },
		"Continue -3": func() { batching.Continue(keys, 1, nil, -3) },
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatal("no panic")
				}
			}()
			f()
		})
	}
}

func txs(evs []ev) []int64 {
	out := make([]int64, len(evs))
	for i := range evs {
		out[i] = evs[i].Tx
	}
	return out
}

// randomLog builds n events whose producer transactions have random sizes in
// [1, maxTx] and whose (host, user) pairs change at random inside them.
func randomLog(r *rand.Rand, n, maxTx int) []ev {
	out := make([]ev, 0, n)
	var tx int64
	for len(out) < n {
		tx += 1 + r.Int64N(3) // ids increase, not necessarily by one
		size := 1 + r.IntN(maxTx)
		host, user := "h0", "u0"
		for i := 0; i < size && len(out) < n; i++ {
			if r.IntN(4) == 0 {
				host = fmt.Sprintf("h%d", r.IntN(3))
				user = fmt.Sprintf("u%d", r.IntN(3))
			}
			out = append(out, ev{Off: int64(len(out)), Tx: tx, Host: host, User: user})
		}
	}
	return out
}

// consume simulates a worker reading log with keyset pagination: it fetches
// batchSize+1 rows, calls Cut, and while extend is true fetches chunk+1 rows
// after the last handled row and calls Continue. It returns the batches in
// order. Every fetch returns fresh copies, like a database would, and only the
// rows of the current fetch are held besides the batch being assembled.
func consume(t testing.TB, log []ev, batchSize, chunk int) [][]ev {
	t.Helper()
	next := 0 // offset of the first unread row
	fetch := func(limit int) []ev {
		end := min(next+limit, len(log))
		return slices.Clone(log[next:end])
	}
	var batches [][]ev
	for iter := 0; ; iter++ {
		if iter > len(log)+1 {
			t.Fatalf("no progress after %d batches", iter)
		}
		rows := fetch(batchSize + 1)
		n, extend, more := batching.Cut(keys, rows, batchSize)
		checkResult(t, "Cut", len(rows), batchSize, n, extend, more)
		batch := slices.Clone(rows[:n])
		next += n
		for extend {
			txID := batch[len(batch)-1].Tx
			rows = fetch(chunk + 1)
			n, extend, more = batching.Continue(keys, txID, rows, chunk)
			checkResult(t, "Continue", len(rows), chunk, n, extend, more)
			batch = append(batch, rows[:n]...)
			next += n
		}
		if len(batch) > 0 {
			batches = append(batches, batch)
		}
		if more != (next < len(log)) {
			t.Fatalf("more = %v with %d of %d rows read", more, next, len(log))
		}
		if !more {
			return batches
		}
	}
}

func checkResult(t testing.TB, fn string, fetched, limit, n int, extend, more bool) {
	t.Helper()
	if fetched > limit+1 {
		t.Fatalf("%s: fetched %d rows with limit %d+1", fn, fetched, limit)
	}
	if n < 0 || n > fetched {
		t.Fatalf("%s: n = %d out of range [0, %d]", fn, n, fetched)
	}
	if extend && more {
		t.Fatalf("%s: extend and more both true", fn)
	}
	if extend && n != limit+1 {
		t.Fatalf("%s: extend with n = %d, want %d", fn, n, limit+1)
	}
}

// checkBatches asserts that the batches partition log in order, that no unit
// (run of equal TxID) is split across batches and that every batch is
// minimal: it ends at the first unit boundary at or after batchSize events.
func checkBatches(t testing.TB, log []ev, batches [][]ev, batchSize int) {
	t.Helper()
	var i int
	for b, batch := range batches {
		if len(batch) == 0 {
			t.Fatalf("batch %d is empty", b)
		}
		for _, e := range batch {
			if i >= len(log) || e != log[i] {
				t.Fatalf("batch %d: got event %+v at position %d, want %+v", b, e, i, log[min(i, len(log)-1)])
			}
			i++
		}
		if i < len(log) {
			if last := batch[len(batch)-1]; last.Tx == log[i].Tx {
				t.Fatalf("batch %d ends at offset %d inside transaction %d", b, last.Off, last.Tx)
			}
			// A batch short of batchSize could not take the next
			// transaction whole.
			next := 0
			for j := i; j < len(log) && log[j].Tx == log[i].Tx; j++ {
				next++
			}
			if len(batch) < batchSize && len(batch)+next <= batchSize {
				t.Fatalf("batch %d has %d events < batchSize %d and stops before transaction %d of %d events",
					b, len(batch), batchSize, log[i].Tx, next)
			}
		}
		// A batch goes past batchSize only as one transaction larger than it.
		if len(batch) > batchSize {
			for _, e := range batch {
				if e.Tx != batch[0].Tx {
					t.Fatalf("batch %d has %d events > batchSize %d over several transactions", b, len(batch), batchSize)
				}
			}
		}
	}
	if i != len(log) {
		t.Fatalf("batches cover %d of %d events", i, len(log))
	}
}

func TestConsumeSimulation(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	log := randomLog(r, 1000, 50)
	for _, chunk := range []int{1, 3, 10, 64} {
		t.Run(fmt.Sprintf("chunk=%d", chunk), func(t *testing.T) {
			batches := consume(t, log, 10, chunk)
			checkBatches(t, log, batches, 10)
			for _, b := range batches {
				checkUnitsRuns(t, b)
			}
		})
	}
}

func TestConsumeEdgeLogs(t *testing.T) {
	tests := []struct {
		name      string
		log       []ev
		batchSize int
		chunk     int
		want      [][]int64
	}{
		{"empty", nil, 3, 2, nil},
		{"one tx smaller than batch", mk(1, 1), 3, 2, [][]int64{{1, 1}}},
		{"one huge tx", mk(1, 1, 1, 1, 1, 1, 1, 1, 1), 2, 2, [][]int64{{1, 1, 1, 1, 1, 1, 1, 1, 1}}},
		{"tx ends at chunk edge", mk(1, 1, 1, 1, 1, 1, 2), 2, 2, [][]int64{{1, 1, 1, 1, 1, 1}, {2}}},
		{"singletons", mk(1, 2, 3, 4, 5), 2, 1, [][]int64{{1, 2}, {3, 4}, {5}}},
		{"doc example", mk(1, 2, 2, 2, 2, 2, 3), 3, 2, [][]int64{{1}, {2, 2, 2, 2, 2}, {3}}},
		{"tx straddles the limit", mk(1, 2, 3, 3, 4), 3, 2, [][]int64{{1, 2}, {3, 3, 4}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			batches := consume(t, tc.log, tc.batchSize, tc.chunk)
			checkBatches(t, tc.log, batches, tc.batchSize)
			var got [][]int64
			for _, b := range batches {
				got = append(got, txs(b))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("batches = %v, want %v", got, tc.want)
			}
		})
	}
}

type hu struct{ h, u string }

func evHU(tx int64, pairs ...hu) []ev {
	out := make([]ev, len(pairs))
	for i, p := range pairs {
		out[i] = ev{Off: int64(i), Tx: tx, Host: p.h, User: p.u}
	}
	return out
}

func TestUnits(t *testing.T) {
	tests := []struct {
		name string
		evs  []ev
		want [][]int64
	}{
		{"empty", nil, nil},
		{"one", mk(1), [][]int64{{1}}},
		{"one unit", mk(3, 3, 3), [][]int64{{3, 3, 3}}},
		{"several", mk(1, 2, 2, 3, 3, 3, 4), [][]int64{{1}, {2, 2}, {3, 3, 3}, {4}}},
		{"equal ids apart are distinct units", mk(1, 2, 1), [][]int64{{1}, {2}, {1}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			units := batching.Units(keys, tc.evs)
			var got [][]int64
			for _, u := range units {
				got = append(got, txs(u))
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("Units = %v, want %v", got, tc.want)
			}
			checkUnitsRuns(t, tc.evs)
		})
	}
}

func TestRuns(t *testing.T) {
	a, b, c := hu{"h1", "u1"}, hu{"h1", "u2"}, hu{"h2", "u1"}
	tests := []struct {
		name string
		unit []ev
		want []int // run lengths
	}{
		{"empty", nil, nil},
		{"one", evHU(1, a), []int{1}},
		{"one run", evHU(1, a, a, a), []int{3}},
		{"user changes", evHU(1, a, a, b), []int{2, 1}},
		{"host changes", evHU(1, a, c, c), []int{1, 2}},
		{"pair returns later", evHU(1, a, b, a, a), []int{1, 1, 2}},
		{"host/user concatenation is not confused", []ev{{Host: "ab", User: "c"}, {Host: "a", User: "bc"}}, []int{1, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			for _, r := range batching.Runs(keys, tc.unit) {
				got = append(got, len(r))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Runs lengths = %v, want %v", got, tc.want)
			}
			checkUnitsRuns(t, tc.unit)
		})
	}
}

func TestUnitsDoNotCopyAndAreClipped(t *testing.T) {
	evs := mk(1, 1, 2)
	units := batching.Units(keys, evs)
	if &units[0][0] != &evs[0] || &units[1][0] != &evs[2] {
		t.Fatal("Units copied the events")
	}
	_ = append(units[0], ev{Tx: 99})
	if evs[2].Tx != 2 {
		t.Fatal("appending to a unit overwrote the next unit")
	}
	runs := batching.Runs(keys, evHU(1, hu{"a", "b"}, hu{"c", "d"}))
	if cap(runs[0]) != 1 {
		t.Fatalf("run capacity = %d, want 1", cap(runs[0]))
	}
}

func TestEachStopsOnError(t *testing.T) {
	stop := errors.New("stop")
	var calls int
	err := batching.EachUnit(keys, mk(1, 2, 3), func(unit []ev) error {
		calls++
		if unit[0].Tx == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || calls != 2 {
		t.Fatalf("EachUnit: err = %v after %d calls, want stop after 2", err, calls)
	}
	calls = 0
	err = batching.EachRun(keys, evHU(1, hu{"a", "a"}, hu{"b", "b"}, hu{"c", "c"}), func(run []ev) error {
		calls++
		return stop
	})
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("EachRun: err = %v after %d calls, want stop after 1", err, calls)
	}
	if err := batching.EachUnit(keys, nil, func([]ev) error { return stop }); err != nil {
		t.Fatalf("EachUnit on empty input = %v, want nil", err)
	}
	if err := batching.EachRun(keys, nil, func([]ev) error { return stop }); err != nil {
		t.Fatalf("EachRun on empty input = %v, want nil", err)
	}
}

// checkUnitsRuns asserts the Units/Runs/EachUnit/EachRun invariants on evs:
// the pieces are non-empty, concatenate to evs without copying, are uniform
// and maximal, and the Each* variants yield exactly the same pieces.
func checkUnitsRuns(t testing.TB, evs []ev) {
	t.Helper()
	units := batching.Units(keys, evs)
	checkPieces(t, "unit", evs, units, func(a, b *ev) bool { return a.Tx == b.Tx })
	var eachUnits [][]ev
	if err := batching.EachUnit(keys, evs, func(u []ev) error {
		eachUnits = append(eachUnits, u)
		runs := batching.Runs(keys, u)
		checkPieces(t, "run", u, runs, func(a, b *ev) bool { return a.Host == b.Host && a.User == b.User })
		var eachRuns [][]ev
		if err := batching.EachRun(keys, u, func(r []ev) error {
			eachRuns = append(eachRuns, r)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		samePieces(t, "EachRun", runs, eachRuns)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	samePieces(t, "EachUnit", units, eachUnits)
}

func checkPieces(t testing.TB, what string, all []ev, pieces [][]ev, same func(a, b *ev) bool) {
	t.Helper()
	i := 0
	for p, piece := range pieces {
		if len(piece) == 0 {
			t.Fatalf("%s %d is empty", what, p)
		}
		if &piece[0] != &all[i] {
			t.Fatalf("%s %d is not a sub-slice of the input at %d", what, p, i)
		}
		if cap(piece) != len(piece) {
			t.Fatalf("%s %d: cap %d != len %d", what, p, cap(piece), len(piece))
		}
		for j := range piece {
			if !same(&piece[0], &piece[j]) {
				t.Fatalf("%s %d is not uniform at %d", what, p, j)
			}
		}
		i += len(piece)
		if i < len(all) && same(&piece[len(piece)-1], &all[i]) {
			t.Fatalf("%s %d is not maximal", what, p)
		}
	}
	if i != len(all) {
		t.Fatalf("%ss cover %d of %d events", what, i, len(all))
	}
}

func samePieces(t testing.TB, what string, want, got [][]ev) {
	t.Helper()
	if len(want) != len(got) {
		t.Fatalf("%s yielded %d pieces, want %d", what, len(got), len(want))
	}
	for i := range want {
		if len(want[i]) != len(got[i]) || &want[i][0] != &got[i][0] {
			t.Fatalf("%s piece %d differs", what, i)
		}
	}
}

// FuzzCutContinue consumes a log derived from the fuzz input with Cut and
// Continue and checks that the batches partition the log in order without
// splitting a transaction, and the Units/Runs invariants on every batch.
func FuzzCutContinue(f *testing.F) {
	f.Add([]byte{}, uint8(3), uint8(2))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0}, uint8(1), uint8(1))
	f.Add([]byte{0, 32, 32, 32, 32, 32, 64}, uint8(2), uint8(1))
	f.Add([]byte("the quick brown fox jumps over the lazy dog"), uint8(4), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, batchSize, chunk uint8) {
		bs := int(batchSize%16) + 1
		ch := int(chunk%16) + 1
		log := make([]ev, len(data))
		for i, b := range data {
			// The top three bits pick the transaction id, so neighbours
			// often share it; an id may also reappear later, which the
			// package must treat as a new unit. The low bits pick the run.
			log[i] = ev{
				Off:  int64(i),
				Tx:   int64(b >> 5),
				Host: string(rune('a' + (b>>2)&1)),
				User: string(rune('x' + b&3)),
			}
		}
		batches := consume(t, log, bs, ch)
		checkBatches(t, log, batches, bs)
		for _, b := range batches {
			checkUnitsRuns(t, b)
		}
		checkUnitsRuns(t, log)
	})
}

var sinkN int

func BenchmarkCut(b *testing.B) {
	rows := mk(1, 1, 2, 2, 2, 3, 3, 3, 3, 3, 4)
	b.ReportAllocs()
	for b.Loop() {
		n, _, _ := batching.Cut(keys, rows, 10)
		sinkN += n
	}
}

func BenchmarkContinue(b *testing.B) {
	rows := mk(1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2)
	b.ReportAllocs()
	for b.Loop() {
		n, _, _ := batching.Continue(keys, 1, rows, 10)
		sinkN += n
	}
}

func benchLog() []ev {
	return randomLog(rand.New(rand.NewPCG(3, 4)), 1000, 50)
}

func BenchmarkEachUnit(b *testing.B) {
	log := benchLog()
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		_ = batching.EachUnit(keys, log, func(unit []ev) error {
			n += len(unit)
			return nil
		})
		sinkN += n
	}
}

func BenchmarkEachUnitEachRun(b *testing.B) {
	log := benchLog()
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		_ = batching.EachUnit(keys, log, func(unit []ev) error {
			return batching.EachRun(keys, unit, func(run []ev) error {
				n += len(run)
				return nil
			})
		})
		sinkN += n
	}
}

func BenchmarkUnitsRuns(b *testing.B) {
	log := benchLog()
	b.ReportAllocs()
	for b.Loop() {
		n := 0
		for _, u := range batching.Units(keys, log) {
			n += len(batching.Runs(keys, u))
		}
		sinkN += n
	}
}
