package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// The wake-up protocol (see the pgevents package's doc). A consumer learns
// of new events in a partition in one of three ways:
//
//   - while events flow, it reads the partitions' tails (Tails) every fraction
//     of a millisecond: the highest offset each append call committed, in
//     partition_tails, which the appends write anyway;
//   - once a partition has been quiet for a while, it goes to sleep on it
//     (Sleep): it takes the partition's sleep key, an advisory lock, shared,
//     and keeps it on its connection, unless an append is in flight there
//     (it holds the partition's flight key). An append to a partition where
//     a consumer sleeps notifies the topic's channel; one that finds nobody
//     asleep holds the key exclusive to commit and notifies nobody. Waking
//     (Wake) releases the key;
//   - every WaitPeriod it polls the log itself (Pending), the safety net.
//
// The race between an append that found nobody asleep and a consumer that
// goes to sleep is closed by the locks (SQL wake_sleepers has the whole
// argument): an append holds the sleep key exclusive from its look to its
// commit, or else is marked in flight from its start to its commit, or else
// notifies; a consumer takes the sleep key, then gives it back if an append
// is in flight, and reads the tail once more after that (in a statement of
// its own): what an append that committed meanwhile wrote is found there,
// and every later append notifies.
const (
	// tailsSQL returns, for each partition in $2, its tail: the highest
	// offset committed there (0 for none), and whether an append is in
	// flight there: one holds the partition's flight key (SQL mark_flight),
	// which it takes shared when it starts and holds to commit. One index
	// lookup per partition, from the end of partition_tails' index,
	// whatever older rows an open snapshot keeps; the key is tried
	// exclusive and released at once (an append that starts in that
	// microsecond goes unmarked, and is found in the tails).
	tailsSQL = `SELECT coalesce((SELECT t.c_offset FROM {schema}partition_tails t
                  WHERE t.topic_id = $1 AND t.partition_id = u.p ORDER BY t.c_offset DESC LIMIT 1), 0),
       CASE WHEN pg_try_advisory_lock(k.key) THEN NOT pg_advisory_unlock(k.key) ELSE true END
FROM unnest($2::integer[]) WITH ORDINALITY AS u(p, i)
CROSS JOIN LATERAL (SELECT {schema}lock_key('flight', $1::integer || '/' || u.p) AS key) k
ORDER BY u.i`

	// tailsOnlySQL is tailsSQL without the look at appends in flight, for
	// Sleep, which holds the keys it took.
	tailsOnlySQL = `SELECT coalesce((SELECT t.c_offset FROM {schema}partition_tails t
                  WHERE t.topic_id = $1 AND t.partition_id = p ORDER BY t.c_offset DESC LIMIT 1), 0)
FROM unnest($2::integer[]) WITH ORDINALITY AS u(p, i)
ORDER BY u.i`

	// sleepSQL tries to take, shared and for the session, the sleep key of
	// each partition in $2, and then looks at its flight key: an append in
	// flight there holds it, and the sleep key is given back (false: the
	// consumer stays awake). Sleep reads the tails in a statement of its
	// own after it: a statement's snapshot is taken when it starts, before
	// its tries, and would miss an append that committed meanwhile.
	sleepSQL = `SELECT CASE WHEN NOT pg_try_advisory_lock_shared(k.sleep) THEN false
            WHEN pg_try_advisory_lock(k.flight) THEN pg_advisory_unlock(k.flight)
            ELSE NOT pg_advisory_unlock_shared(k.sleep) END
FROM unnest($2::integer[]) WITH ORDINALITY AS u(p, i)
CROSS JOIN LATERAL (SELECT {schema}lock_key('sleep', $1::integer || '/' || u.p) AS sleep,
                           {schema}lock_key('flight', $1::integer || '/' || u.p) AS flight) k
ORDER BY u.i`

	// appendsSQL reads the topic's appends counter (log_counter.appends),
	// which every append call draws from when it starts: NULL before the
	// first append, or when the topic has none yet.
	appendsSQL = `SELECT pg_sequence_last_value(c.appends) FROM {schema}log_counter c WHERE c.topic_id = $1`

	// wakeSQL releases the session's sleep keys of the partitions in $2.
	wakeSQL = `SELECT pg_advisory_unlock_shared({schema}lock_key('sleep', $1::integer || '/' || p))
FROM unnest($2::integer[]) AS p`
)

// Appends returns the topic's appends counter: a value that moves when an
// append starts (any value; it cycles), or -1 when there is none.
func Appends(ctx context.Context, db schema.DB, topic int) (int64, error) {
	var n *int64
	if err := db.QueryRow(ctx, schema.SQL(ctx, appendsSQL), topic).Scan(&n); err != nil {
		return 0, fmt.Errorf("offsets: appends counter: %w", err)
	}
	if n == nil {
		return -1, nil
	}
	return *n, nil
}

// Tail is what Tails read of one partition.
type Tail struct {
	// Offset is the highest offset committed in the partition (0: none).
	Offset int64
	// InFlight says that an append to the partition was in flight: it
	// committed nothing yet, and notifies nobody when it does.
	InFlight bool
}

// Tails returns the tails of partitions of topic, in their order.
func Tails(ctx context.Context, db schema.DB, topic int, partitions []int) ([]Tail, error) {
	rows, err := db.Query(ctx, schema.SQL(ctx, tailsSQL), topic, partitions)
	if err != nil {
		return nil, fmt.Errorf("offsets: tails: %w", err)
	}
	return scanTails(rows)
}

// scanTails reads tailsSQL's rows.
func scanTails(rows pgx.Rows) ([]Tail, error) {
	var t Tail
	var out []Tail
	if _, err := pgx.ForEachRow(rows, []any{&t.Offset, &t.InFlight}, func() error {
		out = append(out, t)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("offsets: tails: %w", err)
	}
	return out, nil
}

// AppendsAndTails is Appends and Tails in one round trip (two statements,
// the tails' snapshot taken after the counter's read), for a watcher that
// would read the tails anyway: the counter moved lately.
func AppendsAndTails(ctx context.Context, db schema.DB, topic int, partitions []int) (int64, []Tail, error) {
	var b pgx.Batch
	b.Queue(schema.SQL(ctx, appendsSQL), topic)
	b.Queue(schema.SQL(ctx, tailsSQL), topic, partitions)
	br := db.SendBatch(ctx, &b)
	defer br.Close()
	var n *int64
	if err := br.QueryRow().Scan(&n); err != nil {
		return 0, nil, fmt.Errorf("offsets: appends counter: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return 0, nil, fmt.Errorf("offsets: tails: %w", err)
	}
	out, err := scanTails(rows)
	if err != nil {
		return 0, nil, err
	}
	if err := br.Close(); err != nil {
		return 0, nil, fmt.Errorf("offsets: tails: %w", err)
	}
	if n == nil {
		return -1, out, nil
	}
	return *n, out, nil
}

// Asleep is what Sleep did for one partition.
type Asleep struct {
	// Got says that the session now holds the partition's sleep key: appends
	// to the partition notify from now on. False when an append in flight
	// holds the key, or is marked in flight: the caller stays awake and
	// looks again.
	Got bool
	// Tail is the partition's tail, read once the key was held (when Got).
	Tail int64
}

// Sleep tries to go to sleep on partitions of topic, on db's session (a
// connection the caller keeps while asleep): see the protocol above. For
// each partition it says whether the sleep key is held and, if so, the
// tail read after taking it; a tail beyond what the caller knew means an
// append committed meanwhile, and the caller should Wake and handle it.
func Sleep(ctx context.Context, db schema.DB, topic int, partitions []int) ([]Asleep, error) {
	var b pgx.Batch
	b.Queue(schema.SQL(ctx, sleepSQL), topic, partitions)
	b.Queue(schema.SQL(ctx, tailsOnlySQL), topic, partitions)
	br := db.SendBatch(ctx, &b)
	defer br.Close()
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("offsets: sleep: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	if err != nil {
		return nil, fmt.Errorf("offsets: sleep: %w", err)
	}
	rows, err = br.Query()
	if err != nil {
		return nil, fmt.Errorf("offsets: sleep: %w", err)
	}
	tails, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("offsets: sleep: %w", err)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("offsets: sleep: %w", err)
	}
	if len(got) != len(partitions) || len(tails) != len(partitions) {
		return nil, fmt.Errorf("offsets: sleep: %d answers for %d partitions", len(got), len(partitions))
	}
	out := make([]Asleep, len(partitions))
	for i := range out {
		out[i] = Asleep{Got: got[i], Tail: tails[i]}
	}
	return out, nil
}

// Wake releases, on db's session, the sleep keys of partitions of topic
// that Sleep took there: appends stop notifying them (unless another
// consumer sleeps on them).
func Wake(ctx context.Context, db schema.DB, topic int, partitions []int) error {
	if _, err := db.Exec(ctx, schema.SQL(ctx, wakeSQL), topic, partitions); err != nil {
		return fmt.Errorf("offsets: wake: %w", err)
	}
	return nil
}

// PruneHistory deletes every tail of topic but the newest of each partition,
// and every position but the newest of each group and partition (SQL
// prune_history), and returns how many rows it deleted.
func PruneHistory(ctx context.Context, db schema.DB, topic int) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, schema.SQL(ctx, `SELECT {schema}prune_history($1)`), topic).Scan(&n); err != nil {
		return 0, fmt.Errorf("offsets: prune history: %w", err)
	}
	return n, nil
}

// PruneKeys deletes the idempotency keys of topic older than its window
// (SQL prune_keys), and returns how many it deleted.
func PruneKeys(ctx context.Context, db schema.DB, topic int) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, schema.SQL(ctx, `SELECT {schema}prune_keys($1)`), topic).Scan(&n); err != nil {
		return 0, fmt.Errorf("offsets: prune idempotency keys: %w", err)
	}
	return n, nil
}
