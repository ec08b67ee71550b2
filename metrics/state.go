package metrics

import (
	"context"
	"fmt"
	"time"

	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/schema"
)

// DefaultLagCap is the default cap on the number of events counted per
// partition for the lag in events (pgevents_consumer_lag_events and the
// status command): counting stops there, and the partition is reported as
// capped.
const DefaultLagCap = 100000

// stateSQL reads, in one statement and one round trip, the state of every
// (group, partition) of a topic: $1 is a group (” for every group that
// has a position on the topic), $2 the topic, $3 the cap on counted events.
// The first row always exists and carries the database-wide values (the
// database clock and pg_notification_queue_usage()) and those of the
// topic's sequencer, when it is sequenced (the session holding its key,
// the sessions waiting for it, its last tick, the staged events no tick
// moved yet); when no group has a position its partition columns are NULL.
// A partition's lag counts the events staged for it (StagedSQL): every
// group is yet to handle them.
//
// Why it is cheap, whatever the size of the log:
//
//   - the groups come from group_layouts and subscriptions, the partitions
//     from log_counter and the group's layout (a row each), and each
//     position is the newest row of consumer_positions, read from the end
//     of its index (whatever older rows an open snapshot keeps): a few rows
//     per group, and the leases likewise from partition_leases;
//   - every read of outbox_message_t names topic_id, partition_id and a
//     bound on c_offset, with ORDER BY c_offset and a LIMIT, or max(), so it
//     is an index (only) scan of the primary key (topic_id, partition_id,
//     c_offset) of the partition's segments, touching only the rows it
//     returns: log end is one descending index probe, the first unhandled
//     event one ascending probe, and the lag count reads at most $3 index
//     entries, never the partition's history;
//   - while a group finishes an older layout after a repartition, the lag
//     count also includes the new layout's events of the same partition
//     number (the first unhandled event, and so the lag in seconds, is
//     exact);
//   - the staged events of a sequenced topic are read through the staging
//     tables' xid index, from the last tick's snapshot on, up to $3 in
//     all (StagedSQL); the sequencer's key is looked up in pg_locks for a
//     sequenced topic only;
//   - a partition's report of failing batches (partition_failures) is
//     its owner's row, read through the table's primary key;
//   - open dead letters are counted through dead_letter_queue_position_idx
//     (group_id, topic_id, partition_id, first_offset), halts are read
//     through partition_halts' primary key.
//
// So a scrape costs O(groups × partitions × (log segments + lag, capped at
// $3)), and nothing when nobody lags.
const stateSQL = `WITH topic AS (
    SELECT c.topic_id, c.total_partitions FROM {schema}log_counter c WHERE c.topic_id = $2
),
` + store.StagedSQL + `,
sequencer AS (
    SELECT q.ticked_at, ss.holder, ss.waiting,
           (SELECT coalesce(sum(sg.events), 0)::bigint FROM staged sg) AS staged,
           (SELECT min(sg.oldest) FROM staged sg) AS oldest
    FROM {schema}sequencer_ticks q CROSS JOIN (` + store.SequencerSessionsSQL + `) ss
    WHERE q.topic_id = $2
),
groups AS (
    SELECT $1::text AS group_id WHERE $1::text <> ''
    UNION
    SELECT gl.group_id FROM {schema}group_layouts gl WHERE gl.topic_id = $2 AND $1::text = ''
    UNION
    SELECT s.group_id FROM {schema}subscriptions s WHERE s.topic_id = $2 AND $1::text = ''
),
glayout AS (
    -- Each group's partition count is its layout's (it may still be
    -- finishing an older one after a repartition), and each of its
    -- partitions ends at its first offset in the next layout (layout_cut).
    SELECT g.group_id, t.topic_id,
           coalesce(l.total_partitions, t.total_partitions) AS total_partitions, gl.version
    FROM topic t
    CROSS JOIN groups g
    LEFT JOIN {schema}group_layouts gl ON gl.group_id = g.group_id AND gl.topic_id = t.topic_id
    LEFT JOIN {schema}topic_layouts l ON l.topic_id = t.topic_id AND l.version = gl.version
),
parts AS (
    SELECT g.group_id, g.topic_id, p.partition_id, o.next_offset,
           coalesce({schema}layout_cut(g.topic_id, g.version, p.partition_id), 9223372036854775807) AS below
    FROM glayout g
    CROSS JOIN generate_series(0, g.total_partitions - 1) AS p(partition_id)
    LEFT JOIN LATERAL (
        SELECT o.next_offset FROM {schema}consumer_positions o
        WHERE o.group_id = g.group_id AND o.topic_id = g.topic_id AND o.partition_id = p.partition_id
        ORDER BY o.seq DESC LIMIT 1
    ) o ON true
),
state AS (
    SELECT s.group_id, s.partition_id, s.next_offset,
           e.log_end,
           CASE WHEN s.next_offset IS NULL THEN NULL ELSE lag.events END AS lag_events,
           greatest(extract(epoch FROM clock_timestamp() - lag.first_at)::float8, 0) AS lag_seconds,
           d.n AS dead_letters_open,
           h.c_offset AS halt_offset, h.reason AS halt_reason, h.halted_at,
           w.owner, w.epoch, w.heartbeat_at, w.live,
           sub.state AS subscription, k.n AS skipped,
           fl.failures, fl.since AS failing_since, fl.class AS failing_class, fl.failed_in, fl.error AS failing_error
    FROM parts s` + store.LagReadsSQL + `    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM {schema}dead_letter_queue q
        WHERE q.group_id = s.group_id AND q.topic_id = s.topic_id AND q.partition_id = s.partition_id
    ) d
    LEFT JOIN {schema}partition_halts h
           ON h.group_id = s.group_id AND h.topic_id = s.topic_id AND h.partition_id = s.partition_id
    LEFT JOIN {schema}partition_ownership w
           ON w.group_id = s.group_id AND w.topic_id = s.topic_id AND w.partition_id = s.partition_id
    LEFT JOIN {schema}subscriptions sub
           ON sub.group_id = s.group_id AND sub.topic_id = s.topic_id
    LEFT JOIN {schema}partition_failures fl
           ON fl.group_id = s.group_id AND fl.topic_id = s.topic_id AND fl.partition_id = s.partition_id
          AND fl.replica_id = w.owner AND w.live
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(r.skipped), 0)::bigint AS n FROM {schema}retention_skips r
        WHERE r.group_id = s.group_id AND r.topic_id = s.topic_id AND r.partition_id = s.partition_id
    ) k
)
SELECT clock_timestamp(), pg_notification_queue_usage(), (SELECT t.total_partitions FROM topic t),
       s.group_id, s.partition_id, s.next_offset, s.log_end, s.lag_events, s.lag_seconds,
       s.dead_letters_open, s.halt_offset, s.halt_reason, s.halted_at,
       s.owner, s.epoch, s.heartbeat_at, s.live, s.subscription, s.skipped,
       s.failures, s.failing_since, s.failing_class, s.failed_in, s.failing_error,
       q.ticked_at IS NOT NULL, q.holder, q.waiting, q.ticked_at, q.staged,
       greatest(extract(epoch FROM clock_timestamp() - q.oldest)::float8, 0)
FROM (SELECT 1) one
LEFT JOIN sequencer q ON true
LEFT JOIN state s ON true
ORDER BY s.group_id, s.partition_id`

// State is what the database says about a topic's consumer groups at one
// moment, read by ReadState.
type State struct {
	// Topic is the topic read.
	Topic int
	// DatabaseTime is the database clock when the state was read.
	DatabaseTime time.Time
	// NotificationQueueUsage is pg_notification_queue_usage(): the fraction
	// (0 to 1) of the server's notification queue in use. It grows when a
	// listening session stops reading its notifications.
	NotificationQueueUsage float64
	// TotalPartitions is the topic's partition count; 0 when the topic
	// does not exist.
	TotalPartitions int
	// LagCap is the cap on PartitionState.LagEvents.
	LagCap int64
	// Partitions has one entry per group and partition of the topic, by
	// group then partition. It is empty when the topic does not exist or
	// no group was found.
	Partitions []PartitionState
	// Sequencer is the topic's sequencer when the topic is sequenced; nil
	// otherwise.
	Sequencer *Sequencer
}

// Sequencer is the state of a sequenced topic's sequencer: which process
// moves what producers commit into the log, when it last did, and what
// waits for it.
type Sequencer struct {
	// Session is the application_name of the session that holds the
	// topic's sequencer key, "pgevents sequencer <replica>" (a consumer's)
	// or "pgevents sequencer maintain" (consumer maintain's); empty when no
	// process sequences the topic.
	Session string
	// Waiting counts the sessions waiting to take the key over.
	Waiting int
	// LastTick is when a tick last moved events into the log (the topic's
	// creation before the first), on the database clock.
	LastTick time.Time
	// LastTickSeconds is DatabaseTime minus LastTick, in seconds.
	LastTickSeconds float64
	// Staged counts the events committed in the staging tables that no
	// tick has moved into the log yet, up to State.LagCap; the partitions'
	// lag includes them.
	Staged int64
	// StagedCapped says that counting stopped at State.LagCap: at least
	// Staged events wait.
	StagedCapped bool
	// StagedSeconds is the database clock minus the created_at of the
	// oldest of them; 0 when there is none.
	StagedSeconds float64
}

// PartitionState is a group's state in one partition.
type PartitionState struct {
	// Group is the consumer group.
	Group string
	// Partition is the partition.
	Partition int
	// NextOffset is the group's position, the next offset it reads; nil
	// when the group has no position in the partition (no process of the
	// group ever served it).
	NextOffset *int64
	// LogEnd is the highest offset in the partition; nil when the
	// partition holds no event.
	LogEnd *int64
	// LagEvents counts the partition's events at or after NextOffset, up
	// to State.LagCap; 0 without a position.
	LagEvents int64
	// LagCapped says that counting stopped at State.LagCap: the lag is at
	// least LagEvents.
	LagCapped bool
	// LagSeconds is the database clock minus the created_at of the first
	// event at or after NextOffset; 0 when there is none.
	LagSeconds float64
	// DeadLettersOpen counts the group's rows in dead_letter_queue for the
	// partition: dead letters neither replayed nor discarded.
	DeadLettersOpen int64
	// Halt says where and why the partition is halted; nil when it is not.
	Halt *Halt
	// Lease is the live lease of the replica that owns the partition; nil
	// when no replica holds a live lease on it.
	Lease *Lease
	// Subscription is the group's subscription state (ACTIVE, PAUSED,
	// DEAD, CANCELLED); empty when the group has none.
	Subscription string
	// Skipped counts the partition's events that retention removed before
	// the group handled them.
	Skipped int64
	// Failing is the owner's report that the partition's batches have
	// failed since its last commit; nil when they commit.
	Failing *Failing
}

// Failing is a partition owner's report of its failing batches, from
// partition_failures: written at most every few seconds while batches
// fail, deleted by the next commit.
type Failing struct {
	// Failures counts the batches that failed since the last commit.
	Failures int
	// Since is when the first of them failed, on the database clock.
	Since time.Time
	// Class is the latest failure's class (transient, deployment,
	// permanent, unknown).
	Class string
	// FailedIn says where it came from: handler, batch or session.
	FailedIn string
	// Error is its error.
	Error string
}

// Lease is the owner of a partition, from the partition_ownership view.
type Lease struct {
	// Owner is the replica id.
	Owner string
	// Epoch is the lease's epoch, the fencing token.
	Epoch int64
	// Heartbeat is the owner's last renewal, on the database clock.
	Heartbeat time.Time
}

// HasPosition reports whether the group has a position in the partition.
func (p *PartitionState) HasPosition() bool { return p.NextOffset != nil }

// Halt is a row of partition_halts.
type Halt struct {
	// Offset is the offset of the unit the partition stopped before.
	Offset int64
	// Reason is the failure that halted it.
	Reason string
	// Since is when it halted.
	Since time.Time
}

// ReadState reads the state of group on topic (of every group with a
// position on the topic when group is empty) in one statement, counting
// lag up to lagCap events per partition (DefaultLagCap when lagCap <= 0).
func ReadState(ctx context.Context, q schema.DB, group string, topic int, lagCap int64) (State, error) {
	if lagCap <= 0 {
		lagCap = DefaultLagCap
	}
	st := State{Topic: topic, LagCap: lagCap}
	rows, err := store.QueryWithoutJIT(ctx, q, schema.SQL(ctx, stateSQL), group, topic, lagCap)
	if err != nil {
		return st, fmt.Errorf("metrics: read state: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var (
			g                      *string
			part                   *int32
			lagEvents, deadLetters *int64
			lagSeconds             *float64
			haltOffset             *int64
			haltReason             *string
			haltedAt               *time.Time
			next, logEnd           *int64
			total                  *int32
			owner                  *string
			epoch                  *int64
			heartbeat              *time.Time
			live                   *bool
			subscription           *string
			skipped                *int64
			failures               *int32
			failingSince           *time.Time
			failingClass, failedIn *string
			failingError           *string
			sequenced              bool
			seqHolder              *string
			seqWaiting, seqStaged  *int64
			seqTick                *time.Time
			seqStagedSeconds       *float64
		)
		if err := rows.Scan(&st.DatabaseTime, &st.NotificationQueueUsage, &total, &g, &part, &next, &logEnd,
			&lagEvents, &lagSeconds, &deadLetters, &haltOffset, &haltReason, &haltedAt,
			&owner, &epoch, &heartbeat, &live, &subscription, &skipped,
			&failures, &failingSince, &failingClass, &failedIn, &failingError,
			&sequenced, &seqHolder, &seqWaiting, &seqTick, &seqStaged, &seqStagedSeconds); err != nil {
			return st, fmt.Errorf("metrics: read state: %w", err)
		}
		if total != nil {
			st.TotalPartitions = int(*total)
		}
		if sequenced && st.Sequencer == nil {
			sq := &Sequencer{}
			if seqHolder != nil {
				sq.Session = *seqHolder
			}
			if seqWaiting != nil {
				sq.Waiting = int(*seqWaiting)
			}
			if seqTick != nil {
				sq.LastTick = *seqTick
				sq.LastTickSeconds = max(st.DatabaseTime.Sub(*seqTick).Seconds(), 0)
			}
			if seqStaged != nil {
				sq.Staged = min(*seqStaged, lagCap)
				sq.StagedCapped = *seqStaged >= lagCap
			}
			if seqStagedSeconds != nil {
				sq.StagedSeconds = *seqStagedSeconds
			}
			st.Sequencer = sq
		}
		if g == nil || part == nil {
			continue // the database-wide row of a topic without groups
		}
		ps := PartitionState{Group: *g, Partition: int(*part), NextOffset: next, LogEnd: logEnd}
		if lagEvents != nil {
			ps.LagEvents = *lagEvents
			ps.LagCapped = *lagEvents >= lagCap
		}
		if lagSeconds != nil && next != nil {
			ps.LagSeconds = *lagSeconds
		}
		if deadLetters != nil {
			ps.DeadLettersOpen = *deadLetters
		}
		if haltOffset != nil {
			ps.Halt = &Halt{Offset: *haltOffset}
			if haltReason != nil {
				ps.Halt.Reason = *haltReason
			}
			if haltedAt != nil {
				ps.Halt.Since = *haltedAt
			}
		}
		if owner != nil && live != nil && *live {
			ps.Lease = &Lease{Owner: *owner}
			if epoch != nil {
				ps.Lease.Epoch = *epoch
			}
			if heartbeat != nil {
				ps.Lease.Heartbeat = *heartbeat
			}
		}
		if subscription != nil {
			ps.Subscription = *subscription
		}
		if skipped != nil {
			ps.Skipped = *skipped
		}
		if failures != nil && failingSince != nil && failingClass != nil && failedIn != nil && failingError != nil {
			ps.Failing = &Failing{Failures: int(*failures), Since: *failingSince, Class: *failingClass, FailedIn: *failedIn, Error: *failingError}
		}
		st.Partitions = append(st.Partitions, ps)
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("metrics: read state: %w", err)
	}
	return st, nil
}
