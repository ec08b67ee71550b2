package console

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/schema"
)

// Live rates. A rate is measured between two readings of positions (a
// group's, or a topic's head): the events of each partition between the
// two, counted in the log (countRangesSQL), over the time between the
// readings on the database clock. Readings are taken when a page is
// served, at most one per minSample per series; nothing runs in the
// background, so a console nobody looks at reads nothing.
const (
	minSample   = time.Second
	keepSamples = 60
	// countCap bounds the events counted per partition between two
	// readings.
	countCap = 10_000_000
)

// rates holds the last reading and recent rates of each series.
type rates struct {
	mu sync.Mutex
	m  map[string]*series
}

// series is one group's (or topic's) readings.
type series struct {
	at   time.Time       // database clock of the last reading
	pos  map[int32]int64 // positions at the last reading
	rate float64         // the last rate measured; -1: none yet
	hist []float64       // recent rates, oldest first
	busy bool            // a measurement is running
}

func newRates() *rates { return &rates{m: map[string]*series{}} }

// observe records a reading of series key (positions pos of topic at
// database time now) and returns the latest rate in events per second
// (-1 while unknown) and the recent rates.
func (rs *rates) observe(ctx context.Context, pool *pgxpool.Pool, key string, topic int, pos map[int32]int64, now time.Time) (float64, []float64) {
	rs.mu.Lock()
	s := rs.m[key]
	if s == nil {
		rs.m[key] = &series{at: now, pos: pos, rate: -1}
		rs.mu.Unlock()
		return -1, nil
	}
	if s.busy || now.Sub(s.at) < minSample {
		rate, hist := s.rate, append([]float64(nil), s.hist...)
		rs.mu.Unlock()
		return rate, hist
	}
	s.busy = true
	prevAt, prev := s.at, s.pos
	rs.mu.Unlock()

	n, err := countMoved(ctx, pool, topic, prev, pos)

	rs.mu.Lock()
	defer rs.mu.Unlock()
	s.busy = false
	if err == nil {
		s.rate = float64(n) / now.Sub(prevAt).Seconds()
		s.hist = append(s.hist, s.rate)
		if len(s.hist) > keepSamples {
			s.hist = s.hist[len(s.hist)-keepSamples:]
		}
		s.at, s.pos = now, pos
	}
	return s.rate, append([]float64(nil), s.hist...)
}

// countMoved counts the events between positions from and to, partition by
// partition (a position that went back, a reset, counts nothing).
func countMoved(ctx context.Context, pool *pgxpool.Pool, topic int, from, to map[int32]int64) (int64, error) {
	var parts []int32
	var fs, ts []int64
	for p, t := range to {
		if f, ok := from[p]; ok && t > f {
			parts, fs, ts = append(parts, p), append(fs, f), append(ts, t)
		}
	}
	if len(parts) == 0 {
		return 0, nil
	}
	counts, err := countRanges(ctx, pool, topic, parts, fs, ts, countCap)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, c := range counts {
		n += c
	}
	return n, nil
}

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
