package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/pgeventstype"
	"github.com/pgevents/pgevents/schema"
)

// SyncCommitSQL makes the transaction it runs in commit synchronously, on
// a consumer connection whose commits are otherwise asynchronous
// (ParsePoolConfig): a transaction that bumps a lease epoch must not be
// lost in a server crash, or two owners could act under the same fencing
// token.
const SyncCommitSQL = `SET LOCAL synchronous_commit = on`

// NoLimit is the end of a layout that no newer layout follows.
const NoLimit = pgeventstype.NoLimit

// Layout statements. A group consumes one layout at a time; moving to the
// next happens in one transaction, under the group's position locks, once
// every partition of the layout is finished up to the cut.
const (
	// initGroupLayoutSQL starts a new group in the layout of the first
	// retained event, the one initSQL starts its positions at (or in the
	// current layout when the topic is empty). The first event is looked
	// for partition by partition, the first row of each through its index
	// (the log's index orders a partition's rows by offset, not the
	// topic's), and only for a group that has no layout yet: a min() over
	// the topic read every event of the backlog at every consumer start.
	initGroupLayoutSQL = `INSERT INTO {schema}group_layouts (group_id, topic_id, version)
SELECT $1, $2, coalesce(
    (SELECT max(l.version) FROM {schema}topic_layouts l WHERE l.topic_id = $2
       AND l.from_offset <= (SELECT min(f.c_offset) FROM {schema}partition_counters pc
                             CROSS JOIN LATERAL (SELECT m.c_offset FROM {schema}outbox_message_t m
                                                 WHERE m.topic_id = $2 AND m.partition_id = pc.partition_id
                                                 ORDER BY m.c_offset LIMIT 1) f
                             WHERE pc.topic_id = $2)),
    (SELECT max(l.version) FROM {schema}topic_layouts l WHERE l.topic_id = $2))
WHERE NOT EXISTS (SELECT 1 FROM {schema}group_layouts g WHERE g.group_id = $1 AND g.topic_id = $2)
ON CONFLICT (group_id, topic_id) DO NOTHING`

	// groupLayoutSQL reads the group's layout and where each of its
	// partitions ends: its first offset in the next layout, or NoLimit.
	groupLayoutSQL = `SELECT g.version, l.total_partitions, l.from_offset,
       (SELECT array_agg(coalesce({schema}layout_cut(g.topic_id, g.version, p), 9223372036854775807) ORDER BY p)
          FROM generate_series(0, l.total_partitions - 1) AS p)
FROM {schema}group_layouts g
JOIN {schema}topic_layouts l ON l.topic_id = g.topic_id AND l.version = g.version
WHERE g.group_id = $1 AND g.topic_id = $2`

	// switchLockSQL serialises layout switches of one group.
	switchLockSQL = `SELECT version FROM {schema}group_layouts WHERE group_id = $1 AND topic_id = $2 FOR UPDATE`

	// lockPositionsSQL waits for the group's batches in flight and keeps
	// new ones out until the switch commits (the position locks of every
	// partition the group has a position in, ascending).
	lockPositionsSQL = `SELECT count(*) FROM {schema}lock_group_positions($1, $2)`

	// layoutDoneSQL says whether every partition of the group has handled
	// every event of layout $3, up to the partition's cut.
	// Each position is the newest row of consumer_positions, read from the
	// end of its index (the consumer_offsets view would read every row an
	// open snapshot keeps).
	layoutDoneSQL = `SELECT NOT EXISTS (
    SELECT 1 FROM {schema}topic_layouts l
    CROSS JOIN generate_series(0, l.total_partitions - 1) AS p(partition_id)
    CROSS JOIN LATERAL (SELECT o.next_offset FROM {schema}consumer_positions o
                        WHERE o.group_id = $1 AND o.topic_id = $2 AND o.partition_id = p.partition_id
                        ORDER BY o.seq DESC LIMIT 1) o
    WHERE l.topic_id = $2 AND l.version = $3
      AND EXISTS (SELECT 1 FROM {schema}outbox_message_t m
                  WHERE m.topic_id = $2 AND m.partition_id = p.partition_id
                    AND m.c_offset >= o.next_offset AND m.c_offset < {schema}layout_cut($2, $3, p.partition_id)))`

	// switchSQL moves the group to the next layout $4 of $3 partitions:
	// positions at each partition's first offset in it, leases freed with a higher epoch (epochs never
	// go back, so fencing tokens stay monotonic per partition), parked
	// hosts, parked events and dead letters moved to their host's new
	// partition (a dead letter's unit may now span partitions: resolving it
	// locks every partition of the group), and the group's version bumped.
	// SwitchLayout notifies every consumer of the topic at the switch's
	// commit (NotifyEligible): the group's other replicas follow it to the
	// next layout then, not at their next poll, which may be an hour away,
	// while the partitions the balance leaves to them have no owner.
	switchSQL = `WITH drop_pos AS (
    DELETE FROM {schema}consumer_positions WHERE group_id = $1 AND topic_id = $2 AND partition_id >= $3
), set_pos AS (
    INSERT INTO {schema}consumer_positions (group_id, topic_id, partition_id, next_offset)
    SELECT $1, $2, p, {schema}layout_start($2, $4, p) FROM generate_series(0, $3 - 1) AS p
), top_epoch AS (
    SELECT coalesce(max(epoch), 0) AS e FROM {schema}partition_leases WHERE group_id = $1 AND topic_id = $2
), drop_leases AS (
    DELETE FROM {schema}partition_leases WHERE group_id = $1 AND topic_id = $2 AND partition_id >= $3
), free_leases AS (
    UPDATE {schema}partition_leases SET owner = '', epoch = (SELECT e FROM top_epoch) + 1, expires_at = '-infinity'
    WHERE group_id = $1 AND topic_id = $2 AND partition_id < $3
), add_leases AS (
    INSERT INTO {schema}partition_leases (group_id, topic_id, partition_id, epoch)
    SELECT $1, $2, p, (SELECT e FROM top_epoch) + 1 FROM generate_series(0, $3 - 1) AS p
    ON CONFLICT (group_id, topic_id, partition_id) DO NOTHING
), parked AS (
    UPDATE {schema}parked_hosts SET partition_id = {schema}event_partition(host_id, $3)
    WHERE group_id = $1 AND topic_id = $2
), parked_ev AS (
    UPDATE {schema}parked_events SET partition_id = {schema}event_partition(event->>'host_id', $3)
    WHERE group_id = $1 AND topic_id = $2
), dead AS (
    UPDATE {schema}dead_letter_queue SET partition_id = {schema}event_partition(host_ids[1], $3)
    WHERE group_id = $1 AND topic_id = $2
)
UPDATE {schema}group_layouts SET version = version + 1, switched_at = now()
WHERE group_id = $1 AND topic_id = $2`
)

// Layout is the layout a group consumes.
type Layout struct {
	// Version numbers the topic's layouts from 1.
	Version int
	// Partitions is the layout's partition count.
	Partitions int
	// From is the layout's first offset.
	From int64
	// Below holds, for each partition p of the layout, at Below[p], its
	// first offset in the next layout (the partition's cut), or NoLimit
	// when no layout follows.
	Below []int64
}

// Cut returns partition p's cut: events of p at or after it belong to the
// next layout.
func (l Layout) Cut(p int) int64 {
	if p < len(l.Below) {
		return l.Below[p]
	}
	return NoLimit
}

// Final reports whether no layout follows l.
func (l Layout) Final() bool {
	for _, b := range l.Below {
		if b != NoLimit {
			return false
		}
	}
	return true
}

// InitGroupLayout records the layout a new group starts in; an existing
// group keeps its own.
func InitGroupLayout(ctx context.Context, q schema.DB, group string, topic int) error {
	if _, err := q.Exec(ctx, schema.SQL(ctx, initGroupLayoutSQL), group, topic); err != nil {
		return fmt.Errorf("init layout of group %q: %w", group, err)
	}
	return nil
}

// GroupLayout returns the layout the group consumes.
func GroupLayout(ctx context.Context, q schema.DB, group string, topic int) (Layout, error) {
	var l Layout
	err := q.QueryRow(ctx, schema.SQL(ctx, groupLayoutSQL), group, topic).Scan(&l.Version, &l.Partitions, &l.From, &l.Below)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, fmt.Errorf("group %q has no layout of topic %d (not initialised)", group, topic)
	}
	if err != nil {
		return l, fmt.Errorf("layout of group %q: %w", group, err)
	}
	return l, nil
}

// LayoutDone says, without locking anything, whether every partition of
// the group has handled every event of layout version, up to its cut.
func LayoutDone(ctx context.Context, q schema.DB, group string, topic, version int) (bool, error) {
	var done bool
	if err := q.QueryRow(ctx, schema.SQL(ctx, layoutDoneSQL), group, topic, version).Scan(&done); err != nil {
		return false, fmt.Errorf("layout done: %w", err)
	}
	return done, nil
}

// SwitchLayout moves the group from layout from to the next one, if every
// partition of from has handled every event below the cut and no other
// replica switched first. It reports whether the group is now past from.
// It waits for the group's batches in flight.
func SwitchLayout(ctx context.Context, db schema.DB, group string, topic int, from Layout, next Layout) (bool, error) {
	tx, err := Begin(ctx, db)
	if err != nil {
		return false, fmt.Errorf("switch layout: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	var version int
	if err := tx.QueryRow(ctx, schema.SQL(ctx, switchLockSQL), group, topic).Scan(&version); err != nil {
		return false, fmt.Errorf("switch layout: %w", err)
	}
	if version != from.Version {
		return true, nil // another replica switched already
	}
	if _, err := tx.Exec(ctx, SyncCommitSQL); err != nil {
		return false, fmt.Errorf("switch layout: %w", err)
	}
	if _, err := tx.Exec(ctx, schema.SQL(ctx, lockPositionsSQL), group, topic); err != nil {
		return false, fmt.Errorf("switch layout: %w", err)
	}
	var done bool
	if err := tx.QueryRow(ctx, schema.SQL(ctx, layoutDoneSQL), group, topic, from.Version).Scan(&done); err != nil {
		return false, fmt.Errorf("switch layout: %w", err)
	}
	if !done {
		return false, nil
	}
	if _, err := tx.Exec(ctx, schema.SQL(ctx, switchSQL), group, topic, next.Partitions, next.Version); err != nil {
		return false, fmt.Errorf("switch layout: %w", err)
	}
	if err := NotifyEligible(ctx, tx, topic); err != nil {
		return false, fmt.Errorf("switch layout: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("switch layout: %w", err)
	}
	return true, nil
}

// NextLayout returns the topic's layout after version, or false when there
// is none.
func NextLayout(ctx context.Context, q schema.DB, topic, version int) (Layout, bool, error) {
	var l Layout
	err := q.QueryRow(ctx, schema.SQL(ctx, `SELECT version, total_partitions, from_offset FROM {schema}topic_layouts
WHERE topic_id = $1 AND version = $2`), topic, version+1).Scan(&l.Version, &l.Partitions, &l.From)
	if errors.Is(err, pgx.ErrNoRows) {
		return l, false, nil
	}
	if err != nil {
		return l, false, fmt.Errorf("next layout: %w", err)
	}
	return l, true, nil
}
