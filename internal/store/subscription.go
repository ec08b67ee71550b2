package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// Start is where a group starts reading (pgevents.StartPosition, which
// parses and documents it).
type Start struct {
	Kind   string // "earliest", "latest", "offset" or "time"
	Offset int64
	Time   time.Time
}

// String returns the position as pgevents.ParseStartPosition reads it.
func (s Start) String() string {
	switch s.Kind {
	case "offset":
		return "offset:" + strconv.FormatInt(s.Offset, 10)
	case "time":
		return "time:" + s.Time.Format(time.RFC3339Nano)
	}
	return s.Kind
}

// Subscription states; see migration 0005 for the lifecycle.
const (
	StateActive    = "ACTIVE"
	StatePaused    = "PAUSED"
	StateDead      = "DEAD"
	StateCancelled = "CANCELLED"
)

// Subscription and start-position statements.
const (
	// subscribeSQL registers a group on a topic, or records that one of its
	// replicas is live: a DEAD subscription comes back to ACTIVE. It
	// returns the state and whether the subscription is new (the group's
	// first start).
	subscribeSQL = `INSERT INTO {schema}subscriptions (group_id, topic_id, start_from, dead_after)
VALUES ($1, $2, $3, $4::interval)
ON CONFLICT (group_id, topic_id) DO UPDATE
SET last_seen_at = clock_timestamp(),
    dead_after = excluded.dead_after,
    state = CASE WHEN subscriptions.state = 'DEAD' THEN 'ACTIVE' ELSE subscriptions.state END,
    state_changed_at = CASE WHEN subscriptions.state = 'DEAD' THEN now() ELSE subscriptions.state_changed_at END
RETURNING state, xmax = 0`

	// heartbeatSQL is subscribeSQL for a group known to exist.
	heartbeatSQL = `UPDATE {schema}subscriptions
SET last_seen_at = clock_timestamp(),
    state = CASE WHEN state = 'DEAD' THEN 'ACTIVE' ELSE state END,
    state_changed_at = CASE WHEN state = 'DEAD' THEN now() ELSE state_changed_at END
WHERE group_id = $1 AND topic_id = $2
RETURNING state`

	// setStateSQL applies an operator's transition if it is valid from the
	// current state.
	setStateSQL = `UPDATE {schema}subscriptions SET state = $3, state_changed_at = now()
WHERE group_id = $1 AND topic_id = $2 AND state = ANY($4::text[])
RETURNING state`

	stateSQL = `SELECT state FROM {schema}subscriptions WHERE group_id = $1 AND topic_id = $2`

	// notifyEligibleSQL notifies the topic's channel, at the commit of the
	// statement's transaction, with a payload that names no partition
	// ("<topic>:*"): every consumer of the topic polls at once, and reads
	// its group's state (subscription, halts, layout) again. Every change
	// that may make a partition eligible again sends it in its own
	// transaction (NotifyEligible): a resume (any change of a
	// subscription's state), an unhalt, a reset, a layout switch.
	notifyEligibleSQL = `SELECT pg_notify(channel, $1::integer || ':*') FROM {schema}log_counter WHERE topic_id = $1`

	// sweepDeadSQL marks ACTIVE groups without a heartbeat for their
	// dead_after as DEAD.
	sweepDeadSQL = `UPDATE {schema}subscriptions SET state = 'DEAD', state_changed_at = now()
WHERE topic_id = $1 AND state = 'ACTIVE' AND last_seen_at < clock_timestamp() - dead_after
RETURNING group_id`

	// startLayoutSQL chooses the layout a group placed at a start position
	// ($2 the kind, $3 the offset, $4 the time) begins in: the oldest layout
	// with a retained event (earliest), the layout of the first event at or
	// after the time (time), the layout holding the offset under scope
	// 'topic' (offset), or the current one. It returns the layout's version
	// and partition count. An event of partition p with offset o belongs to
	// the newest layout v with layout_start(t, v, p) <= o.
	startLayoutSQL = `WITH cur AS (
    SELECT max(version) AS v FROM {schema}topic_layouts WHERE topic_id = $1
), firsts AS (
    SELECT pc.partition_id, f.o
    FROM {schema}partition_counters pc
    CROSS JOIN LATERAL (
        SELECT m.c_offset AS o FROM {schema}outbox_message_t m
        WHERE m.topic_id = $1 AND m.partition_id = pc.partition_id
          AND ($2::text = 'earliest' OR m.created_at >= $4::timestamptz)
        ORDER BY m.c_offset LIMIT 1
    ) f
    WHERE pc.topic_id = $1 AND $2::text IN ('earliest', 'time')
), v AS (
    SELECT CASE
        WHEN $2::text IN ('earliest', 'time') THEN coalesce((
            SELECT min(lv.v) FROM firsts f
            CROSS JOIN LATERAL (SELECT max(l.version) AS v FROM {schema}topic_layouts l
                                WHERE l.topic_id = $1 AND {schema}layout_start($1, l.version, f.partition_id) <= f.o) lv),
            (SELECT v FROM cur))
        WHEN $2::text = 'offset' AND c.offset_scope = 'topic' THEN coalesce(
            (SELECT max(l.version) FROM {schema}topic_layouts l WHERE l.topic_id = $1 AND l.from_offset <= $3), 1)
        ELSE (SELECT v FROM cur)
    END AS v
    FROM {schema}log_counter c WHERE c.topic_id = $1
)
SELECT l.version, l.total_partitions FROM v JOIN {schema}topic_layouts l ON l.topic_id = $1 AND l.version = v.v`

	// startPositionsSQL computes the positions of a group placed in layout
	// $5 of $6 partitions at a start position ($2 kind, $3 offset, $4 time):
	// for each partition p, its first retained event (earliest), its first
	// event at or after the time (time), the offset (offset), or its next
	// offset (latest; and where no such event exists), within p's offsets
	// in the layout, at element p+1. $7 holds every partition's next offset,
	// read before in a statement of its own (nextOffsetsSQL), so that an
	// event below it that is committed is visible here.
	startPositionsSQL = `SELECT array_agg(least(
           coalesce({schema}layout_cut($1, $5, p), 9223372036854775807),
           greatest({schema}layout_start($1, $5, p),
                    CASE $2::text
                        WHEN 'offset' THEN $3::bigint
                        WHEN 'latest' THEN ($7::bigint[])[p + 1]
                        ELSE coalesce((SELECT m.c_offset FROM {schema}outbox_message_t m
                                       WHERE m.topic_id = $1 AND m.partition_id = p
                                         AND m.c_offset >= {schema}layout_start($1, $5, p)
                                         AND ($2::text = 'earliest' OR m.created_at >= $4::timestamptz)
                                       ORDER BY m.c_offset LIMIT 1), ($7::bigint[])[p + 1])
                    END)) ORDER BY p)
FROM generate_series(0, $6 - 1) AS p`

	liveReplicasOfSQL = `SELECT count(*) FROM {schema}consumer_replicas
WHERE group_id = $1 AND topic_id = $2 AND expires_at > clock_timestamp()`

	lockSubscriptionSQL = `SELECT state FROM {schema}subscriptions WHERE group_id = $1 AND topic_id = $2 FOR UPDATE`

	// oldPositionsSQL reads the group's positions, once lockPositionsSQL
	// has taken their locks.
	oldPositionsSQL = `SELECT partition_id, next_offset FROM {schema}consumer_offsets
WHERE group_id = $1 AND topic_id = $2 ORDER BY partition_id`

	// placeSQL puts the group at positions $4 (element p+1 for partition p)
	// in layout $5 of $3 partitions (run after deleting its positions and
	// leases): positions, fresh leases with epoch $6 (above every earlier
	// one, so fencing tokens never go back), parked hosts, parked events and
	// dead letters in their host's partition of that layout.
	placeSQL = `WITH add_pos AS (
    INSERT INTO {schema}consumer_positions (group_id, topic_id, partition_id, next_offset)
    SELECT $1, $2, p, ($4::bigint[])[p + 1] FROM generate_series(0, $3 - 1) AS p
), add_leases AS (
    INSERT INTO {schema}partition_leases (group_id, topic_id, partition_id, epoch)
    SELECT $1, $2, p, $6 FROM generate_series(0, $3 - 1) AS p
), parked AS (
    UPDATE {schema}parked_hosts SET partition_id = {schema}event_partition(host_id, $3) WHERE group_id = $1 AND topic_id = $2
), parked_ev AS (
    UPDATE {schema}parked_events SET partition_id = {schema}event_partition(event->>'host_id', $3) WHERE group_id = $1 AND topic_id = $2
), dead AS (
    UPDATE {schema}dead_letter_queue SET partition_id = {schema}event_partition(host_ids[1], $3) WHERE group_id = $1 AND topic_id = $2
)
INSERT INTO {schema}group_layouts (group_id, topic_id, version) VALUES ($1, $2, $5)
ON CONFLICT (group_id, topic_id) DO UPDATE SET version = excluded.version, switched_at = now()`

	// clearSQL removes a group's positions and leases before placeSQL and
	// returns the highest lease epoch it had.
	// unhaltPassedSQL removes the group's halts that its positions have
	// moved past (a reset skipped the unit the partition stopped before)
	// and returns them: a halt says where a partition stopped, and a
	// position beyond it means the unit will never be tried again. A
	// halt at or beyond the position stays: the unit is still ahead.
	unhaltPassedSQL = `DELETE FROM {schema}partition_halts h USING {schema}consumer_offsets o
WHERE h.group_id = $1 AND h.topic_id = $2
  AND o.group_id = h.group_id AND o.topic_id = h.topic_id AND o.partition_id = h.partition_id
  AND o.next_offset > h.c_offset
RETURNING h.partition_id, h.c_offset`

	clearSQL = `WITH pos AS (
    DELETE FROM {schema}consumer_positions WHERE group_id = $1 AND topic_id = $2
), l AS (
    DELETE FROM {schema}partition_leases WHERE group_id = $1 AND topic_id = $2 RETURNING epoch
)
SELECT coalesce(max(epoch), 0) FROM l`

	// unreportedSkipsSQL lists what retention removed before the group
	// handled it and the group was not told yet.
	unreportedSkipsSQL = `UPDATE {schema}retention_skips SET reported_at = now()
WHERE group_id = $1 AND topic_id = $2 AND reported_at IS NULL
RETURNING partition_id, skipped, first_offset, last_offset, reason`
)

// ErrCancelled is returned when a group's subscription is CANCELLED: its
// consumers refuse to start (the state is terminal; use another group id).
var ErrCancelled = errors.New("the group's subscription is CANCELLED")

// ErrGroupRunning is returned by Reset when a replica of the group is live.
var ErrGroupRunning = errors.New("a replica of the group is running")

// ErrTransition is returned by SetState for a transition the lifecycle
// does not allow.
var ErrTransition = errors.New("invalid subscription transition")

// Subscribe registers the group on the topic, or marks it live again, and
// returns its state and whether this was the group's first start. On the
// first start it places the group at start, in the same transaction, so
// that replicas starting together agree on where the group begins.
func Subscribe(ctx context.Context, db schema.DB, group string, topic int, start Start, deadAfter time.Duration) (string, bool, error) {
	tx, err := Begin(ctx, db)
	if err != nil {
		return "", false, fmt.Errorf("subscribe %q: %w", group, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	var (
		state string
		isNew bool
	)
	if err := tx.QueryRow(ctx, schema.SQL(ctx, subscribeSQL), group, topic, start.String(), deadAfter.String()).Scan(&state, &isNew); err != nil {
		return "", false, fmt.Errorf("subscribe %q: %w", group, err)
	}
	if isNew {
		var hasPositions bool
		if err := tx.QueryRow(ctx, schema.SQL(ctx, `SELECT EXISTS (SELECT 1 FROM {schema}consumer_offsets WHERE group_id = $1 AND topic_id = $2)`),
			group, topic).Scan(&hasPositions); err != nil {
			return "", false, fmt.Errorf("subscribe %q: %w", group, err)
		}
		if !hasPositions {
			if err := Place(ctx, tx, group, topic, start); err != nil {
				return "", false, err
			}
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return "", false, fmt.Errorf("subscribe %q: %w", group, err)
	}
	return state, isNew, nil
}

// Heartbeat marks the group live and returns its state.
func Heartbeat(ctx context.Context, q schema.DB, group string, topic int) (string, error) {
	var state string
	if err := q.QueryRow(ctx, schema.SQL(ctx, heartbeatSQL), group, topic).Scan(&state); err != nil {
		return "", fmt.Errorf("heartbeat of %q: %w", group, err)
	}
	return state, nil
}

// allowedFrom lists the states an operator may move a subscription from, by
// target state.
var allowedFrom = map[string][]string{
	StatePaused:    {StateActive},
	StateActive:    {StatePaused},
	StateCancelled: {StateActive, StatePaused, StateDead},
}

// SetState applies an operator's transition (to PAUSED, ACTIVE from
// PAUSED, or CANCELLED) and returns the previous state. A transition to
// the state the group is in already changes nothing and succeeds: pausing
// a paused group, resuming an active one, cancelling a cancelled one; the
// state returned then equals to. Errors name no package: an operator reads
// them as they are.
func SetState(ctx context.Context, db schema.DB, group string, topic int, to string) (string, error) {
	from, ok := allowedFrom[to]
	if !ok {
		return "", fmt.Errorf("%w: no operator transition to %s", ErrTransition, to)
	}
	tx, err := Begin(ctx, db)
	if err != nil {
		return "", fmt.Errorf("set state: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	var prev string
	if err := tx.QueryRow(ctx, schema.SQL(ctx, lockSubscriptionSQL), group, topic).Scan(&prev); errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("group %q has no subscription on topic %d", group, topic)
	} else if err != nil {
		return "", fmt.Errorf("set state: %w", err)
	}
	if prev == to {
		return prev, nil
	}
	var now string
	if err := tx.QueryRow(ctx, schema.SQL(ctx, setStateSQL), group, topic, to, from).Scan(&now); errors.Is(err, pgx.ErrNoRows) {
		return prev, fmt.Errorf("%w: %s -> %s", ErrTransition, prev, to)
	} else if err != nil {
		return prev, fmt.Errorf("set state: %w", err)
	}
	if to != StateActive {
		// Wait for the group's batches in flight, and keep new claims out
		// until the state commits: a claim reads the state after its
		// position lock (claim_state), so once this returns no batch of
		// the group commits anything.
		if _, err := tx.Exec(ctx, schema.SQL(ctx, lockPositionsSQL), group, topic); err != nil {
			return prev, fmt.Errorf("set state: wait for the group's batches: %w", err)
		}
	}
	// The group's consumers follow at the commit, not at their next
	// heartbeat: a resume wakes the partitions within milliseconds.
	if err := NotifyEligible(ctx, tx, topic); err != nil {
		return prev, fmt.Errorf("set state: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return prev, fmt.Errorf("set state: %w", err)
	}
	return prev, nil
}

// NotifyEligible tells every consumer of topic, when db's transaction
// commits, to read its group's state and poll at once (notifyEligibleSQL).
func NotifyEligible(ctx context.Context, db schema.DB, topic int) error {
	if _, err := db.Exec(ctx, schema.SQL(ctx, notifyEligibleSQL), topic); err != nil {
		return fmt.Errorf("notify the topic's consumers: %w", err)
	}
	return nil
}

// SubscriptionState returns the group's state on the topic, or "" when it
// has no subscription.
func SubscriptionState(ctx context.Context, q schema.DB, group string, topic int) (string, error) {
	var state string
	err := q.QueryRow(ctx, schema.SQL(ctx, stateSQL), group, topic).Scan(&state)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("subscription state: %w", err)
	}
	return state, nil
}

// SweepDead marks the topic's ACTIVE groups that went without a heartbeat
// for their dead_after as DEAD, and returns them.
func SweepDead(ctx context.Context, q schema.DB, topic int) ([]string, error) {
	rows, err := q.Query(ctx, schema.SQL(ctx, sweepDeadSQL), topic)
	if err != nil {
		return nil, fmt.Errorf("sweep dead groups: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("sweep dead groups: %w", err)
	}
	return out, nil
}

// lockRetentionShared keeps retention from removing a segment of topic
// until tx ends: take it before resolving a start position, so that the
// position and the segments agree (see ApplyRetention).
func lockRetentionShared(ctx context.Context, tx pgx.Tx, topic int) error {
	if _, err := tx.Exec(ctx, schema.SQL(ctx, retentionLockSharedSQL), topic); err != nil {
		return fmt.Errorf("retention lock of topic %d: %w", topic, err)
	}
	return nil
}

// Place puts a group at a start position: in the layout it designates,
// with a position in each of that layout's partitions and free leases.
// Existing positions are replaced: use it for a group's first start or,
// through Reset, to move a group. It holds retention off (the positions and
// the segments agree) and reads every partition's next offset before it
// looks for events, in a statement of its own, so that an append that
// commits meanwhile is never skipped.
func Place(ctx context.Context, tx pgx.Tx, group string, topic int, start Start) error {
	if err := lockRetentionShared(ctx, tx, topic); err != nil {
		return err
	}
	var nexts []int64
	if err := tx.QueryRow(ctx, schema.SQL(ctx, nextOffsetsSQL), topic).Scan(&nexts); err != nil {
		return fmt.Errorf("place group %q: next offsets: %w", group, err)
	}
	var version, partitions int
	if err := tx.QueryRow(ctx, schema.SQL(ctx, startLayoutSQL), topic, start.Kind, start.Offset, start.Time).Scan(&version, &partitions); err != nil {
		return fmt.Errorf("place group %q at %s: layout: %w", group, start, err)
	}
	var positions []int64
	if err := tx.QueryRow(ctx, schema.SQL(ctx, startPositionsSQL), topic, start.Kind, start.Offset, start.Time, version, partitions, nexts).
		Scan(&positions); err != nil {
		return fmt.Errorf("place group %q at %s: positions: %w", group, start, err)
	}
	var epoch int64
	if err := tx.QueryRow(ctx, schema.SQL(ctx, clearSQL), group, topic).Scan(&epoch); err != nil {
		return fmt.Errorf("place group %q: %w", group, err)
	}
	if _, err := tx.Exec(ctx, schema.SQL(ctx, placeSQL), group, topic, partitions, positions, version, epoch+1); err != nil {
		return fmt.Errorf("place group %q at %s: %w", group, start, err)
	}
	return nil
}

// Move is what Reset did to one partition.
type Move struct {
	Partition int   `json:"partition_id"`
	From      int64 `json:"from"` // -1: no position before
	To        int64 `json:"to"`
	// Unhalted is the offset of the partition's halt that the reset moved
	// past, and removed; nil when it removed none.
	Unhalted *int64 `json:"unhalted,omitempty"`
	// Halted is the offset of the partition's halt that the reset did not
	// move past (it moved to the halt or before), and kept; nil when the
	// partition is not halted.
	Halted *int64 `json:"halted,omitempty"`
}

// Reset moves every position of the group to start (for a replay, or to
// skip), in one transaction, and returns what moved. It refuses while a
// replica of the group is live unless force is set; with force, the live
// replicas lose their leases (their batch in flight cannot commit) and pick
// the new positions up.
func Reset(ctx context.Context, db schema.DB, group string, topic int, start Start, force bool) ([]Move, error) {
	tx, err := Begin(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	var state string
	if err := tx.QueryRow(ctx, schema.SQL(ctx, lockSubscriptionSQL), group, topic).Scan(&state); errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("group %q has no subscription on topic %d", group, topic)
	} else if err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	// The layout before the positions, as SwitchLayout and dead-letter
	// resolution take them; and the new lease epochs must survive a crash
	// (see SyncCommitSQL).
	if _, err := tx.Exec(ctx, schema.SQL(ctx, `SELECT 1 FROM {schema}group_layouts WHERE group_id = $1 AND topic_id = $2 FOR UPDATE`), group, topic); err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	if _, err := tx.Exec(ctx, SyncCommitSQL); err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	var live int
	if err := tx.QueryRow(ctx, schema.SQL(ctx, liveReplicasOfSQL), group, topic).Scan(&live); err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	if live > 0 && !force {
		return nil, fmt.Errorf("%w (%d live): stop it first, or force", ErrGroupRunning, live)
	}
	if _, err := tx.Exec(ctx, schema.SQL(ctx, lockPositionsSQL), group, topic); err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	rows, err := tx.Query(ctx, schema.SQL(ctx, oldPositionsSQL), group, topic)
	if err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	old := map[int]int64{}
	var (
		p int
		n int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&p, &n}, func() error { old[p] = n; return nil }); err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	if err := Place(ctx, tx, group, topic, start); err != nil {
		return nil, err
	}
	rows, err = tx.Query(ctx, schema.SQL(ctx, `SELECT partition_id, next_offset FROM {schema}consumer_offsets
WHERE group_id = $1 AND topic_id = $2 ORDER BY partition_id`), group, topic)
	if err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	var moves []Move
	if _, err := pgx.ForEachRow(rows, []any{&p, &n}, func() error {
		from, ok := old[p]
		if !ok {
			from = -1
		}
		moves = append(moves, Move{Partition: p, From: from, To: n})
		return nil
	}); err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	// The halts moved past are removed; those still ahead are kept.
	rows, err = tx.Query(ctx, schema.SQL(ctx, unhaltPassedSQL), group, topic)
	if err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	unhalted := map[int]int64{}
	if _, err := pgx.ForEachRow(rows, []any{&p, &n}, func() error { unhalted[p] = n; return nil }); err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	halts, err := Halts(ctx, tx, group, topic)
	if err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	for i := range moves {
		m := &moves[i]
		if at, ok := unhalted[m.Partition]; ok {
			m.Unhalted = &at
		}
		for _, h := range halts {
			if h.Partition == m.Partition {
				m.Halted = &h.Offset
			}
		}
	}
	// The group's replicas (forced) follow at the commit.
	if err := NotifyEligible(ctx, tx, topic); err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("reset: %w", err)
	}
	return moves, nil
}

// Skip is a count of events retention removed before a group handled them.
type Skip struct {
	Partition   int
	Skipped     int64
	FirstOffset int64
	LastOffset  int64
	Reason      string
}

// TakeSkips returns the group's skips not reported yet, and marks them
// reported.
func TakeSkips(ctx context.Context, q schema.DB, group string, topic int) ([]Skip, error) {
	rows, err := q.Query(ctx, schema.SQL(ctx, unreportedSkipsSQL), group, topic)
	if err != nil {
		return nil, fmt.Errorf("skips: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Skip])
	if err != nil {
		return nil, fmt.Errorf("skips: %w", err)
	}
	return out, nil
}
