package batching

// Keys tells the package how to read the grouping keys of an event type E.
//
// TxID is required by every function of the package; Host and User are only
// used by [Runs] and [EachRun]. The functions receive a pointer into the
// caller's slice and must not retain it.
type Keys[E any] struct {
	// TxID returns the id of the producer transaction that appended the event.
	TxID func(*E) int64
	// Host returns the host id of the event.
	Host func(*E) string
	// User returns the user id of the event.
	User func(*E) string
}

// Cut decides the batch from rows fetched in offset order with
// LIMIT batchSize+1.
//
// It returns n, the number of leading rows that belong to the batch, and two
// flags that are never both true:
//
//   - extend is true when the transaction of rows[n-1] may continue past the
//     fetched rows and the batch is that one transaction, larger than
//     batchSize. Then n is batchSize+1 (the peeked row belongs to the same
//     transaction, so it is part of the batch) and the caller must read the
//     following rows with [Continue], passing the transaction id of rows[n-1],
//     before the batch is complete.
//   - more is true when the batch is complete and rows are known to exist
//     beyond it: the caller should fetch the next batch without waiting.
//
// When the peeked row continues the transaction of the batchSize-th row and
// that transaction began after the first row, the batch ends before it:
// that transaction starts the next batch, and no more rows are read for
// this one (a transaction is never split, and a batch reads past its
// batchSize only for a transaction larger than batchSize).
//
// When both are false the batch is complete and the partition was exhausted
// by the fetch: the caller is caught up. When extend is true, more is decided
// by the last call of Continue.
//
// len(rows) may be anything from 0 to batchSize+1; rows beyond batchSize+1
// are ignored. Cut panics if batchSize is not positive.
func Cut[E any](k Keys[E], rows []E, batchSize int) (n int, extend bool, more bool) {
	if batchSize <= 0 {
		panic("batching: Cut called with a non-positive batchSize")
	}
	if len(rows) <= batchSize {
		return len(rows), false, false
	}
	tx := k.TxID(&rows[batchSize-1])
	if k.TxID(&rows[batchSize]) != tx {
		return batchSize, false, true
	}
	start := batchSize - 1
	for start > 0 && k.TxID(&rows[start-1]) == tx {
		start--
	}
	if start > 0 {
		return start, false, true
	}
	return batchSize + 1, true, false
}

// Continue examines a chunk fetched after an extended batch and reports how
// much of it still belongs to the transaction being extended.
//
// rows must be the rows that directly follow the last row handed out by the
// previous call of [Cut] or Continue, in offset order, fetched with
// LIMIT chunk+1 (keyset pagination: WHERE c_offset > last offset). txID is the
// id of the transaction being extended, that is the TxID of the last row
// handed out.
//
// It returns n, the number of leading rows with TxID equal to txID, which the
// caller adds to the batch, and two flags that are never both true:
//
//   - extend is true when all chunk+1 rows belong to the transaction, so it
//     may continue: the caller must fetch another chunk after rows[n-1] and
//     call Continue again.
//   - more is true when the transaction ended inside the chunk and a row of
//     another transaction follows it: the batch is complete and the caller
//     should fetch the next batch without waiting.
//
// When both are false the batch is complete and the partition was exhausted
// by the fetch. n may be 0, when the transaction ended exactly where the
// previous chunk ended.
//
// len(rows) may be anything from 0 to chunk+1; rows beyond chunk+1 are
// ignored. Continue panics if chunk is not positive.
func Continue[E any](k Keys[E], txID int64, rows []E, chunk int) (n int, extend bool, more bool) {
	if chunk <= 0 {
		panic("batching: Continue called with a non-positive chunk")
	}
	if len(rows) > chunk+1 {
		rows = rows[:chunk+1]
	}
	for n < len(rows) && k.TxID(&rows[n]) == txID {
		n++
	}
	switch {
	case n < len(rows):
		return n, false, true
	case n == chunk+1:
		return n, true, false
	default:
		return n, false, false
	}
}

// Units splits a slice of consecutive events into units, the maximal runs of
// events with equal TxID, and returns them as sub-slices of evs in order.
//
// Nothing is copied; each unit's capacity is clipped to its length, so
// appending to a unit never overwrites the next one. Units returns nil for an
// empty slice. [EachUnit] does the same without allocating.
func Units[E any](k Keys[E], evs []E) [][]E {
	var out [][]E
	for i := 0; i < len(evs); {
		j := unitEnd(k, evs, i)
		out = append(out, evs[i:j:j])
		i = j
	}
	return out
}

// Runs splits one unit into runs, the maximal sequences of consecutive events
// with equal (Host, User), and returns them as sub-slices of unit in order.
//
// Nothing is copied; each run's capacity is clipped to its length. Runs only
// compares Host and User, so it may be applied to any slice, but runs are
// meant to be taken inside one unit. It returns nil for an empty slice.
// [EachRun] does the same without allocating.
func Runs[E any](k Keys[E], unit []E) [][]E {
	var out [][]E
	for i := 0; i < len(unit); {
		j := runEnd(k, unit, i)
		out = append(out, unit[i:j:j])
		i = j
	}
	return out
}

// EachUnit calls fn for every unit of evs in order, as [Units] would return
// them, without allocating.
//
// It stops at the first error returned by fn and returns it; otherwise it
// returns nil. fn must not retain the unit beyond the lifetime of evs.
func EachUnit[E any](k Keys[E], evs []E, fn func(unit []E) error) error {
	for i := 0; i < len(evs); {
		j := unitEnd(k, evs, i)
		if err := fn(evs[i:j:j]); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// EachRun calls fn for every run of unit in order, as [Runs] would return
// them, without allocating.
//
// It stops at the first error returned by fn and returns it; otherwise it
// returns nil. fn must not retain the run beyond the lifetime of unit.
func EachRun[E any](k Keys[E], unit []E, fn func(run []E) error) error {
	for i := 0; i < len(unit); {
		j := runEnd(k, unit, i)
		if err := fn(unit[i:j:j]); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// unitEnd returns the end (exclusive) of the unit that starts at evs[i].
func unitEnd[E any](k Keys[E], evs []E, i int) int {
	tx := k.TxID(&evs[i])
	j := i + 1
	for j < len(evs) && k.TxID(&evs[j]) == tx {
		j++
	}
	return j
}

// runEnd returns the end (exclusive) of the run that starts at unit[i].
func runEnd[E any](k Keys[E], unit []E, i int) int {
	host, user := k.Host(&unit[i]), k.User(&unit[i])
	j := i + 1
	for j < len(unit) && k.Host(&unit[j]) == host && k.User(&unit[j]) == user {
		j++
	}
	return j
}
