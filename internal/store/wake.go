package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgevents/pgevents/schema"
)

// This file: the wake-up step's SQL. The elected watcher follows and leads
// (Follow, Lead), reads the appends counter (Appends) and the awake
// partitions' tails while announcing what moved (Watch), and goes to sleep
// on quiet partitions (Sleep) and wakes them (Wake); the producers' side is
// SQL: mark_flight, wake_sleepers and the append functions. The protocol,
// and why no event waits for the poll: see docs/concepts.md, "How a
// sleeping partition wakes".
const (
	// tailsOnlySQL reads the tails of the partitions in $2, for Sleep,
	// which holds the keys it took: the highest offset committed in each
	// (0 for none), one index lookup per partition from the end of
	// partition_tails' index, whatever older rows an open snapshot keeps.
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

	// followSQL readies the session of a consumer's watcher to wait for
	// the topic's watch key (waitLeadSQL): the wait ends after $3 ms
	// (lock_timeout), so that the follower can look whether the holder
	// still lives (EndFrozenHolder), and no statement_timeout of the role ends it
	// sooner; the watcher's notifications need not wait for their commit's
	// flush (a notification is a hint; a lost one costs the poll). The
	// settings are the session's, which the watcher closes rather than
	// gives back to the pool. It also takes the topic's follow key, shared:
	// while some session holds it, the elected watcher announces what moved
	// (announceSQL); while none does, it notifies nobody. A consumer that
	// takes the key polls after it: what committed before is found by the
	// poll, what commits after is announced.
	followSQL = `SELECT set_config('lock_timeout', $3::integer || 'ms', false), set_config('statement_timeout', '0', false),
       set_config('synchronous_commit', 'off', false), set_config('application_name', $2, false),
       pg_advisory_lock_shared({schema}lock_key('follow', $1::integer::text))`

	// waitLeadSQL waits until the session holds the topic's watch key, an
	// advisory lock for the session, or the session's lock_timeout ran out
	// (SQLSTATE 55P03): one session per topic and database (and
	// installation) holds it, the elected watcher. The others wait here, in
	// the server, at no cost, and one of them gets the key when the
	// holder's session ends (its process exited, was killed, or its
	// connection dropped). Once elected, the session gives its follow key
	// back.
	waitLeadSQL = `SELECT pg_advisory_lock({schema}lock_key('watch', $1::integer::text)),
       pg_advisory_unlock_shared({schema}lock_key('follow', $1::integer::text))`

	// announceSQL reads, when $5, the topic's appends counter first (as
	// appendsSQL, in a CTE the rest of the statement reads after it: NULL
	// when $5 is false), and for each partition in $2, its tail: the highest
	// offset committed there (0 for none), and whether an append is in
	// flight there: one holds the partition's flight key (SQL mark_flight),
	// which it takes shared when it starts and holds to commit. One index
	// lookup per partition, from the end of partition_tails' index,
	// whatever older rows an open snapshot keeps; the key is tried
	// exclusive and released at once (an append that starts in that
	// microsecond goes unmarked, and is found in the tails).
	//
	// It also notifies the topic's channel $4, in one notification of the
	// producers' form ("<topic>:<partition>/<tail>,..."), of the partitions
	// whose tail is beyond what the watcher read before ($3, element by
	// element), when some consumer's watcher holds the follow key
	// (followSQL; tried exclusive and released at once, as the flight
	// keys). The notification is sent when the statement's implicit
	// transaction commits, and names only tails its snapshot shows, so it
	// never announces an event a consumer cannot read. Past 7,000 bytes it
	// names every partition ("<topic>:*"), as notify_sleepers does.
	//
	// The counter and the tails are read in one statement: the tails in the
	// statement's snapshot, taken before the counter. An append counted
	// here that committed after the snapshot is not among the tails: the
	// counter moved, so the watcher reads the tails again at its next
	// looks (settle), in later snapshots, which show its commit.
	announceSQL = `WITH a AS MATERIALIZED (
    SELECT CASE WHEN $5 THEN (SELECT pg_sequence_last_value(c.appends) FROM {schema}log_counter c WHERE c.topic_id = $1) END AS appends
), t AS MATERIALIZED (
    SELECT u.i, u.p, u.known,
           coalesce((SELECT pt.c_offset FROM {schema}partition_tails pt
                      WHERE pt.topic_id = $1 AND pt.partition_id = u.p ORDER BY pt.c_offset DESC LIMIT 1), 0) AS tail,
           CASE WHEN pg_try_advisory_lock(k.key) THEN NOT pg_advisory_unlock(k.key) ELSE true END AS flight
    FROM a CROSS JOIN unnest($2::integer[], $3::bigint[]) WITH ORDINALITY AS u(p, known, i)
    CROSS JOIN LATERAL (SELECT {schema}lock_key('flight', $1::integer || '/' || u.p) AS key) k
), n AS MATERIALIZED (
    SELECT pg_notify($4, CASE WHEN length(m.msg) > 7000 THEN $1::integer || ':*' ELSE m.msg END)
    FROM (SELECT $1::integer || ':' || string_agg(t.p || '/' || t.tail, ',' ORDER BY t.p) AS msg
            FROM t WHERE t.tail > t.known) m
    CROSS JOIN LATERAL (SELECT {schema}lock_key('follow', $1::integer::text) AS key) f
    WHERE m.msg IS NOT NULL
      AND CASE WHEN pg_try_advisory_lock(f.key) THEN NOT pg_advisory_unlock(f.key) ELSE true END
)
SELECT t.tail, t.flight, (SELECT count(*) FROM n), (SELECT a.appends FROM a) FROM t ORDER BY t.i`
)

// WatcherApplicationName returns the application_name of the session of
// replica's watcher of a topic, elected (holding the watch key) or waiting
// for it: RoleWatcher.ApplicationName.
func WatcherApplicationName(replica string) string {
	return RoleWatcher.ApplicationName(replica)
}

// Follow readies db's session to wait for topic's watch key (see
// followSQL), each wait ending after at most check: from then on, the
// elected watcher announces what commits, and the caller should poll for
// what committed before.
func Follow(ctx context.Context, db schema.DB, topic int, replica string, check time.Duration) error {
	if _, err := db.Exec(ctx, schema.SQL(ctx, followSQL), topic, WatcherApplicationName(replica), check.Milliseconds()); err != nil {
		return fmt.Errorf("follow the watcher: %w", err)
	}
	return nil
}

// Lead waits, on a session readied by Follow, until it holds topic's watch
// key (see waitLeadSQL), and reports whether it does: false when the
// session's wait ran out first. The session's consumer is then the topic's
// elected watcher, until the session ends.
func Lead(ctx context.Context, db schema.DB, topic int) (bool, error) {
	_, err := db.Exec(ctx, schema.SQL(ctx, waitLeadSQL), topic)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("wait for the watch key: %w", err)
	}
	return true, nil
}

// Look is what the elected watcher reads (Watch) in one statement.
type Look struct {
	// Topic and Partitions name the partitions whose tails are read.
	Topic      int
	Partitions []int
	// Known holds, for each of Partitions, the tail the watcher read
	// before: a tail beyond it is announced on Channel, if another
	// consumer's watcher follows.
	Known []int64
	// Channel is the topic's notification channel.
	Channel string
	// Counter asks for the topic's appends counter too, read before the
	// partitions' flight keys.
	Counter bool
}

// Seen is what Watch read.
type Seen struct {
	// Appends is the topic's appends counter (-1: none), when Look.Counter.
	Appends int64
	// Tails are the partitions' tails, in Look.Partitions' order.
	Tails []Tail
}

// Watch reads the appends counter (when l.Counter), and reads (and
// announces) the tails of l.Partitions, in one statement (announceSQL).
func Watch(ctx context.Context, db schema.DB, l Look) (Seen, error) {
	rows, err := db.Query(ctx, schema.SQL(ctx, announceSQL), l.Topic, l.Partitions, l.Known, l.Channel, l.Counter)
	if err != nil {
		return Seen{Appends: -1}, fmt.Errorf("tails: %w", err)
	}
	out := Seen{Appends: -1}
	var (
		t       Tail
		sent    int64  // notifications sent: the column makes the statement run the notification's CTE
		appends *int64 // the counter, the same on every row
	)
	if _, err := pgx.ForEachRow(rows, []any{&t.Offset, &t.InFlight, &sent, &appends}, func() error {
		out.Tails = append(out.Tails, t)
		if appends != nil {
			out.Appends = *appends
		}
		return nil
	}); err != nil {
		return out, fmt.Errorf("tails: %w", err)
	}
	if len(out.Tails) != len(l.Partitions) {
		return out, fmt.Errorf("tails: %d answers for %d partitions", len(out.Tails), len(l.Partitions))
	}
	return out, nil
}

// Appends returns the topic's appends counter: a value that moves when an
// append starts (any value; it cycles), or -1 when there is none.
func Appends(ctx context.Context, db schema.DB, topic int) (int64, error) {
	var n *int64
	if err := db.QueryRow(ctx, schema.SQL(ctx, appendsSQL), topic).Scan(&n); err != nil {
		return 0, fmt.Errorf("appends counter: %w", err)
	}
	if n == nil {
		return -1, nil
	}
	return *n, nil
}

// Tail is what Watch read of one partition.
type Tail struct {
	// Offset is the highest offset committed in the partition (0: none).
	Offset int64
	// InFlight says that an append to the partition was in flight: it
	// committed nothing yet, and notifies nobody when it does.
	InFlight bool
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
// connection the caller keeps while asleep): see the protocol in
// docs/concepts.md, "How a sleeping partition wakes". For
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
		return nil, fmt.Errorf("sleep: %w", err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[bool])
	if err != nil {
		return nil, fmt.Errorf("sleep: %w", err)
	}
	rows, err = br.Query()
	if err != nil {
		return nil, fmt.Errorf("sleep: %w", err)
	}
	tails, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("sleep: %w", err)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("sleep: %w", err)
	}
	if len(got) != len(partitions) || len(tails) != len(partitions) {
		return nil, fmt.Errorf("sleep: %d answers for %d partitions", len(got), len(partitions))
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
		return fmt.Errorf("wake: %w", err)
	}
	return nil
}

// PruneHistory deletes every tail of topic but the newest of each partition,
// and every position but the newest of each group and partition (SQL
// prune_history), and returns how many rows it deleted.
func PruneHistory(ctx context.Context, db schema.DB, topic int) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, schema.SQL(ctx, `SELECT {schema}prune_history($1)`), topic).Scan(&n); err != nil {
		return 0, fmt.Errorf("prune history: %w", err)
	}
	return n, nil
}

// PruneKeys deletes the idempotency keys of topic older than its window
// (SQL prune_keys), and returns how many it deleted.
func PruneKeys(ctx context.Context, db schema.DB, topic int) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, schema.SQL(ctx, `SELECT {schema}prune_keys($1)`), topic).Scan(&n); err != nil {
		return 0, fmt.Errorf("prune idempotency keys: %w", err)
	}
	return n, nil
}
