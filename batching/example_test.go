package batching_test

import (
	"fmt"

	"github.com/pgevents/pgevents/batching"
)

type event struct {
	Offset int64
	TxID   int64
	Host   string
	User   string
}

// Example shows a worker loop that reads a partition with keyset pagination,
// extends each batch to the end of its producer transaction with bounded
// memory, and hands every run of a unit to a group handler.
func Example() {
	k := batching.Keys[event]{
		TxID: func(e *event) int64 { return e.TxID },
		Host: func(e *event) string { return e.Host },
		User: func(e *event) string { return e.User },
	}
	partition := []event{
		{1, 100, "h1", "alice"},
		{2, 101, "h1", "bob"}, {3, 101, "h1", "bob"}, {4, 101, "h2", "carol"},
		{5, 101, "h2", "carol"}, {6, 101, "h1", "bob"},
		{7, 102, "h1", "alice"},
	}
	// fetch stands for SELECT ... WHERE c_offset > after ORDER BY c_offset LIMIT limit.
	fetch := func(after int64, limit int) []event {
		var out []event
		for _, e := range partition {
			if e.Offset > after && len(out) < limit {
				out = append(out, e)
			}
		}
		return out
	}
	handle := func(rows []event) {
		_ = batching.EachUnit(k, rows, func(unit []event) error {
			return batching.EachRun(k, unit, func(run []event) error {
				fmt.Printf("  tx %d %s/%s offsets %d..%d\n",
					run[0].TxID, run[0].Host, run[0].User, run[0].Offset, run[len(run)-1].Offset)
				return nil
			})
		})
	}

	const batchSize, chunk = 3, 2
	var committed int64
	for {
		rows := fetch(committed, batchSize+1)
		n, extend, more := batching.Cut(k, rows, batchSize)
		if n == 0 {
			fmt.Println("caught up")
			break
		}
		fmt.Printf("batch after offset %d:\n", committed)
		handle(rows[:n])
		last := rows[n-1]
		for extend {
			rows = fetch(last.Offset, chunk+1)
			n, extend, more = batching.Continue(k, last.TxID, rows, chunk)
			if n > 0 {
				handle(rows[:n])
				last = rows[n-1]
			}
		}
		committed = last.Offset // commit once the whole transaction is handled
		fmt.Printf("commit %d\n", committed)
		if !more {
			fmt.Println("caught up")
			break
		}
	}
	// Output:
	// batch after offset 0:
	//   tx 100 h1/alice offsets 1..1
	// commit 1
	// batch after offset 1:
	//   tx 101 h1/bob offsets 2..3
	//   tx 101 h2/carol offsets 4..5
	//   tx 101 h1/bob offsets 6..6
	// commit 6
	// batch after offset 6:
	//   tx 102 h1/alice offsets 7..7
	// commit 7
	// caught up
}
