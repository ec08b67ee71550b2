package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
)

// benchPlainDDL creates the plain-SQL baselines beside pgevents' tables: a
// counter row per topic (as log_counter was before migration 0009: the
// next offset, updated by every append) and plain (unpartitioned) log
// tables with the same columns, defaults, constraints and indexes as
// outbox_message_t, one filled through the counter, one through a
// sequence.
const benchPlainDDL = `
CREATE TABLE plain_counter (
    topic_id         integer PRIMARY KEY,
    total_partitions integer NOT NULL,
    next_offset      bigint  NOT NULL DEFAULT 1
) WITH (fillfactor = 10);
INSERT INTO plain_counter (topic_id, total_partitions)
SELECT topic_id, total_partitions FROM log_counter WHERE topic_id = 1;
CREATE TABLE plain_log (LIKE outbox_message_t INCLUDING ALL);
CREATE INDEX plain_log_partition_idx ON plain_log (topic_id, partition_id, c_offset);
CREATE TABLE seq_log (LIKE plain_log INCLUDING ALL);
CREATE SEQUENCE seq_log_offset;
`

// benchPlainSQL returns a plain-SQL append in one statement. With counter,
// it is the same work as append_events without the framework: reserve the
// offsets with UPDATE ... RETURNING on the counter row (whose lock is held
// to commit), insert the rows with one multi-row INSERT into plain_log, and
// (with notify) send one notification naming the partitions and their
// highest offsets. Without counter, offsets come from a sequence into
// seq_log, neither gapless nor commit-ordered: the ceiling without the
// counter lock.
func benchPlainSQL(counter, notify bool) string {
	reserve := `UPDATE plain_counter SET next_offset = next_offset + $2::integer
    WHERE topic_id = $1::integer
    RETURNING next_offset - $2::integer AS first_offset, total_partitions`
	offset, table := "r.first_offset + e.ord - 1", "plain_log"
	if !counter {
		reserve = "SELECT $2::integer AS n, 8 AS total_partitions"
		offset, table = "nextval('seq_log_offset')", "seq_log"
	}
	final := "SELECT count(*) FROM ins"
	if notify {
		final = `SELECT pg_notify('plain_channel', $1::integer::text || ':' || string_agg(p.partition_id || '/' || p.max_offset, ',' ORDER BY p.partition_id))
FROM (SELECT partition_id, max(c_offset) AS max_offset FROM ins GROUP BY partition_id) p`
	}
	return `WITH r AS (
    ` + reserve + `
), ins AS (
    INSERT INTO ` + table + ` (c_offset, topic_id, partition_id, host_id, user_id, transaction_id, event_type, payload)
    SELECT ` + offset + `, $1::integer,
           (abs(hashtext(e.host_id)::bigint) % r.total_partitions)::integer,
           e.host_id, e.user_id, txid_current(), e.event_type, e.payload::jsonb
    FROM r, unnest($3::text[], $4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS e(host_id, user_id, event_type, payload, ord)
    RETURNING partition_id, c_offset
)
` + final
}

// benchPlainAppender returns a producer that appends with statement, a
// benchPlainSQL.
func benchPlainAppender(statement string) benchAppendFunc {
	return func(ctx context.Context, tx pgx.Tx, evs []pgevents.Event) error {
		hosts, users, types, payloads := make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs))
		for i := range evs {
			hosts[i], users[i], types[i], payloads[i] = evs[i].HostID, evs[i].UserID, evs[i].EventType, string(evs[i].Payload)
		}
		_, err := tx.Exec(ctx, statement, benchTopic, len(evs), hosts, users, types, payloads)
		return err
	}
}

// benchVariant is one way of appending, measured against the others.
type benchVariant struct {
	name string
	fn   benchAppendFunc
}

// benchAppend measures the append rate of pgevents.Append against the
// plain-SQL baseline, for transactions of 1 to 1000 events and 1 to 16
// producers, alternating the two in every repetition; then the ceiling of
// single-event transactions without the counter row. (An open snapshot's
// effect is case snapshot.)
func benchAppend(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	db, err := e.newDB(ctx, 8)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if err := db.exec(ctx, benchPlainDDL); err != nil {
		return nil, err
	}
	pool, err := db.openPool(ctx, "bench-producer", 20, nil)
	if err != nil {
		return nil, err
	}
	variants := []benchVariant{
		{"pgevents", benchAppendPgevents},
		{"plain SQL", benchPlainAppender(benchPlainSQL(true, true))},
	}
	ceiling := []benchVariant{
		{"no counter (sequence), NOTIFY", benchPlainAppender(benchPlainSQL(false, true))},
		{"no counter, no NOTIFY", benchPlainAppender(benchPlainSQL(false, false))},
	}
	// Warm up: connections, prepared statements, caches.
	for _, v := range append(variants, ceiling...) {
		if _, err := (benchLoad{producers: 16, txSize: 10, appendFn: v.fn}).run(ctx, pool, 300*time.Millisecond, nil); err != nil {
			return nil, err
		}
	}

	var out []benchResult
	for _, size := range []int{1, 10, 100, 1000} {
		for _, producers := range []int{1, 4, 16} {
			rates, err := benchCompare(ctx, e, db, pool, variants, size, producers)
			if err != nil {
				return out, err
			}
			var ratios []float64
			for i := range rates[0] {
				ratios = append(ratios, rates[0][i]/rates[1][i])
			}
			cell := fmt.Sprintf("%d-event tx, %d producer(s)", size, producers)
			for k, v := range variants {
				out = append(out, newBenchResult("append", cell+": "+v.name, "events/s", rates[k]))
			}
			out = append(out, newBenchResult("append", cell+": pgevents/plain", "ratio", ratios).atLeast(0.9))
		}
	}
	for _, producers := range []int{1, 4, 16} {
		rates, err := benchCompare(ctx, e, db, pool, ceiling, 1, producers)
		if err != nil {
			return out, err
		}
		for k, v := range ceiling {
			out = append(out, newBenchResult("append", fmt.Sprintf("1-event tx, %d producer(s): %s", producers, v.name), "events/s", rates[k]).
				noted("ceiling without the counter row lock: offsets from a sequence, neither gapless nor commit-ordered"))
		}
	}
	return out, nil
}

// benchCompare measures the steady append rate of each variant with
// producers appending transactions of size events, e.reps times, and
// returns the rates by variant. Within a repetition the variants take turns
// in slices (300 ms for small transactions, up to 2 s for large ones, so
// that a slice holds many transactions), so that a slow spell of the disk
// or a busy neighbour falls on all of them alike.
func benchCompare(ctx context.Context, e *benchEnv, db *benchDB, pool *pgxpool.Pool, variants []benchVariant, size, producers int) ([][]float64, error) {
	slice := 300 * time.Millisecond
	switch {
	case size >= 1000:
		slice = 2 * time.Second
	case size >= 100:
		slice = 600 * time.Millisecond
	}
	d := max(slice, benchPick(e, 1200*time.Millisecond, 600*time.Millisecond))
	rounds := int(d / slice)
	rates := make([][]float64, len(variants))
	for rep := range e.reps {
		line := fmt.Sprintf("append: %4d-event tx, %2d producers, rep %d:", size, producers, rep+1)
		events := make([]int64, len(variants))
		spans := make([]time.Duration, len(variants))
		for round := range rounds {
			for i := range variants {
				k := (i + rep + round) % len(variants)
				if err := db.ensureSegments(ctx); err != nil {
					return rates, err
				}
				lr, err := (benchLoad{producers: producers, txSize: size, appendFn: variants[k].fn}).run(ctx, pool, slice, nil)
				if err != nil {
					return rates, fmt.Errorf("%s: %w", variants[k].name, err)
				}
				events[k] += lr.steadyEvents
				spans[k] += lr.steadyDur
			}
		}
		for k := range variants {
			rates[k] = append(rates[k], float64(events[k])/spans[k].Seconds())
		}
		for k, v := range variants {
			line += fmt.Sprintf(" %s %.0f/s", v.name, rates[k][rep])
		}
		e.logf("%s", line)
	}
	return rates, nil
}
