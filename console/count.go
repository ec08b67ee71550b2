package console

import (
	"context"
	"fmt"

	"github.com/pgevents/pgevents/schema"
)

// countCap bounds the events a page counts in a partition: those before
// an event or a host's next one in the host and event paths.
const countCap = 10_000_000

// countRanges counts the events of each partition parts[i] in [from[i],
// to[i]), up to limit each (countRangesSQL).
func countRanges(ctx context.Context, q schema.DB, topic int, parts []int32, from, to []int64, limit int64) (map[int32]int64, error) {
	rows, err := q.Query(ctx, schema.SQL(ctx, countRangesSQL), topic, parts, from, to, limit)
	if err != nil {
		return nil, fmt.Errorf("console: count events: %w", err)
	}
	defer rows.Close()
	out := map[int32]int64{}
	for rows.Next() {
		var p int32
		var n int64
		if err := rows.Scan(&p, &n); err != nil {
			return nil, fmt.Errorf("console: count events: %w", err)
		}
		out[p] += n
	}
	return out, rows.Err()
}
