package pgevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// TestLogLines: the lines a consumer of a sequenced topic writes while its
// sequencer runs, its maintenance creates segments and a handler fails for
// a while keep the rules of the logs (logtest.Check: no key twice, so the
// sequencer's and maintenance's lines carry "topic" once; durations as
// integer milliseconds in keys ending in _ms), and "batch failed" carries
// no next_offset it does not know (0, before any batch of the partition
// committed).
func TestLogLines(t *testing.T) {
	t.Parallel()
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 2, Scope: schema.ScopeSequenced})
	pgtest.ResizeSegments(t, pool, 1, 1000) // the smallest: maintenance creates more as the log grows
	log, buf := logtest.Logger(t, zerolog.Disabled)
	var failures atomic.Int64
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		if failures.Add(1) <= 6 {
			return Retryable(errors.New("not yet"))
		}
		return nil
	}))
	c := startConsumer(t, pool, Config{Handlers: hs, TotalPartitions: 2, Logger: &log, MaintenanceInterval: 50 * time.Millisecond,
		RetryInitial: 7 * time.Millisecond, RetryMax: 60 * time.Millisecond})
	const n = 3000
	for range n / 500 {
		evs := make([]Event, 500)
		for i := range evs {
			evs[i] = ev(fmt.Sprintf("h%d", i%5), "t", `{}`)
		}
		appendTx(t, pool, evs...)
	}
	pgtest.WaitFor(t, 60*time.Second, "every event handled", func() bool { return c.Stats().Handled == n })
	pgtest.WaitFor(t, 30*time.Second, "the sequencer's, maintenance's and a failed batch's lines", func() bool {
		out := buf.String()
		return strings.Contains(out, "sequencing the topic") && strings.Contains(out, "created segments of the log") &&
			strings.Contains(out, "batch failed, rolled back")
	})
	if p := buf.Problems(); len(p) > 0 {
		t.Fatalf("%d log lines break the rules, the first: %s", len(p), p[0])
	}
	for _, line := range strings.Split(buf.String(), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("a log line is not JSON: %v\n%s", err, line)
		}
		switch m["message"] {
		case "sequencing the topic: this process moves what producers commit into the log", "created segments of the log":
			if m["topic"] != float64(1) {
				t.Errorf("line without its topic: %s", line)
			}
		case "batch failed, rolled back":
			if _, ok := m["retry_in_ms"]; !ok {
				t.Errorf("batch failed without retry_in_ms: %s", line)
			}
			if n, ok := m["next_offset"]; ok && n.(float64) < 1 {
				t.Errorf("batch failed with next_offset %v, a position it does not know: %s", n, line)
			}
		}
	}
}
