package schema

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Topic describes one topic of the log.
type Topic struct {
	// ID is the topic's id, the topic_id of its events.
	ID int
	// Partitions is the topic's partition count, recorded in log_counter.
	Partitions int
	// NextOffset is the offset the next append will receive under
	// ScopeTopic; 0 under ScopePartition, whose offsets are per partition.
	NextOffset int64
	// SegmentSize is the number of offsets per segment of outbox_message_t.
	SegmentSize int64
	// Allocation is how offsets are allocated: AllocationCounter or
	// AllocationSequence.
	Allocation string
	// Channel is the NOTIFY channel of the topic's wake-ups.
	Channel string
	// Scope is ScopeTopic (offsets gapless and commit-ordered across the
	// topic), ScopePartition (per partition) or ScopeSequenced (per
	// partition, assigned by the topic's sequencer after commit).
	Scope string
	// Wake is WakeWaiting (appends notify only partitions whose worker may
	// be waiting) or WakeAlways.
	Wake string
}

// Offset scopes of a topic; see migration 0008.
const (
	// ScopeTopic gives the topic one sequence of offsets, gapless (with
	// AllocationCounter) and commit-ordered across all its partitions:
	// every producer of the topic takes the same lock, held to commit.
	ScopeTopic = "topic"
	// ScopePartition gives every partition its own sequence of offsets,
	// gapless and commit-ordered per partition, as in Kafka: producers of
	// different partitions never wait for each other.
	ScopePartition = "partition"
	// ScopeSequenced gives every partition its own sequence of offsets,
	// gapless, assigned after commit: producers insert into a staging
	// table without any lock, and the topic's sequencer moves what
	// committed into the log, in commit order at the granularity of its
	// ticks (migration 0016). Everything that reads the log sees a topic
	// of ScopePartition.
	ScopeSequenced = "sequenced"
)

// Wake-up modes of a topic; see migration 0008.
const (
	// WakeWaiting notifies a partition's worker only when it may be
	// waiting for events: producers of busy partitions send nothing.
	WakeWaiting = "waiting"
	// WakeAlways notifies on every append.
	WakeAlways = "always"
)

// TopicSpec describes a topic to create.
type TopicSpec struct {
	// ID is the topic's id; required, positive.
	ID int
	// Partitions is the partition count; required, 1 to 1024.
	Partitions int
	// SegmentSize is the number of offsets per segment of a partition's
	// table; DefaultSegmentSize when 0.
	SegmentSize int
	// Scope is the offset scope, ScopeTopic (the default), ScopePartition
	// or ScopeSequenced. It is chosen when the topic is created.
	Scope string
	// Channel is the NOTIFY channel of the topic's wake-ups; default
	// ChannelFor the schema of the context, so that two installations in
	// one database never share one. It is used when the topic is created;
	// SetChannel changes it later.
	Channel string
}

// SetWake sets a topic's wake-up mode (WakeWaiting or WakeAlways). When it
// changes to WakeWaiting, the topic's consumers are notified to poll at
// once, which is when they read the mode again: running consumers follow,
// and no event waits for their poll period meanwhile.
func SetWake(ctx context.Context, db DB, id int, wake string) error {
	if _, err := db.Exec(ctx, SQL(ctx, setWakeSQL), id, wake); err != nil {
		return fmt.Errorf("schema: set wake-up mode of topic %d: %w", id, err)
	}
	return nil
}

// TopicWake returns a topic's wake-up mode, WakeWaiting or WakeAlways, and
// its channel, or an error wrapping ErrTopicNotFound.
func TopicWake(ctx context.Context, db DB, id int) (wake, channel string, err error) {
	err = db.QueryRow(ctx, SQL(ctx, wakeSQL), id).Scan(&wake, &channel)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", "", fmt.Errorf("schema: topic %d: %w", id, ErrTopicNotFound)
	}
	if err != nil {
		return "", "", fmt.Errorf("schema: read wake-up mode of topic %d: %w", id, err)
	}
	return wake, channel, nil
}

// DefaultChannel is the NOTIFY channel of the topics of an installation in
// the first schema of the search_path (no schema name), the seed design's
// channel; see ChannelFor.
const DefaultChannel = "event_channel"

// ChannelFor returns the NOTIFY channel that topics created in schema name
// get unless told otherwise: DefaultChannel without a name, and
// "event_channel_<name>" with one (shortened with a hash of the name when
// that would pass the 63 bytes of an identifier). A channel is database-wide,
// not per schema: two installations in one database on one channel would
// wake each other's consumers for nothing (a notification is only ever a
// hint, so nothing is lost or skipped, but every append of one makes the
// other's workers look).
func ChannelFor(name string) string {
	if name == "" {
		return DefaultChannel
	}
	const maxIdent = 63
	c := DefaultChannel + "_" + name
	if len(c) <= maxIdent {
		return c
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	suffix := fmt.Sprintf("_%08x", h.Sum32())
	return c[:maxIdent-len(suffix)] + suffix
}

// setChannelSQL changes a topic's channel and, when it changed, notifies
// the old channel for every partition of the topic ("*"), at commit: the
// running consumers, listening there, look at once, find the new channel
// and listen on it (and find what was appended meanwhile).
const setChannelSQL = `WITH old AS (
    SELECT channel FROM {schema}log_counter WHERE topic_id = $1 AND channel <> $2 FOR NO KEY UPDATE
), u AS (
    UPDATE {schema}log_counter c SET channel = $2 FROM old WHERE c.topic_id = $1 RETURNING old.channel
)
SELECT pg_notify(u.channel, $1::integer || ':*') FROM u`

// SetChannel sets the NOTIFY channel on which the topic's appends wake
// consumers. Running consumers follow: they are told on the old channel and
// listen on the new one at once. A consumer configured explicitly with
// another channel refuses to start (see pgevents.Config.Channel).
func SetChannel(ctx context.Context, db DB, id int, channel string) error {
	if _, err := db.Exec(ctx, SQL(ctx, setChannelSQL), id, channel); err != nil {
		return fmt.Errorf("schema: set channel of topic %d: %w", id, err)
	}
	return nil
}

// installationsSQL lists the other pgevents installations of the database
// that the caller may read: the schemas, other than the one of ctx, holding
// a log_counter with a channel column.
const installationsSQL = `SELECT n.nspname::text
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relname = 'log_counter' AND c.relkind IN ('r', 'p')
  AND c.oid <> '{schema}log_counter'::regclass
  AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'channel' AND NOT a.attisdropped)
  AND has_table_privilege(c.oid, 'SELECT')
ORDER BY 1`

// ChannelUser is a topic of another pgevents installation of the database
// that notifies a channel.
type ChannelUser struct {
	// Schema is the schema of the other installation.
	Schema string
	// Topic is its topic's id.
	Topic int
}

// String returns "topic N of the installation in schema S".
func (u ChannelUser) String() string {
	return fmt.Sprintf("topic %d of the pgevents installation in schema %s", u.Topic, u.Schema)
}

// ChannelUsers returns the topics of the other pgevents installations in the
// database (other schemas, as far as the caller may read them) whose appends
// notify channel. Such a topic wakes this installation's consumers on the
// channel for nothing: see ChannelFor.
func ChannelUsers(ctx context.Context, db DB, channel string) ([]ChannelUser, error) {
	rows, err := db.Query(ctx, SQL(ctx, installationsSQL))
	if err != nil {
		return nil, fmt.Errorf("schema: other installations: %w", err)
	}
	schemas, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("schema: other installations: %w", err)
	}
	var out []ChannelUser
	for _, s := range schemas {
		rows, err := db.Query(ctx, `SELECT topic_id FROM `+pgx.Identifier{s, "log_counter"}.Sanitize()+` WHERE channel = $1 ORDER BY 1`, channel)
		if err != nil {
			return nil, fmt.Errorf("schema: topics of schema %s: %w", s, err)
		}
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil {
			return nil, fmt.Errorf("schema: topics of schema %s: %w", s, err)
		}
		for _, id := range ids {
			out = append(out, ChannelUser{Schema: s, Topic: int(id)})
		}
	}
	return out, nil
}

// DefaultIdempotencyWindow is how long a topic keeps its idempotency keys
// unless SetIdempotencyWindow says otherwise; see migrations 0010 and 0012.
const DefaultIdempotencyWindow = 24 * time.Hour

// SetIdempotencyWindow sets how long an idempotency key of the topic makes
// a second append of it a duplicate, counted from the clock time of the
// append that wrote the key. Keys older than that are appended again, and
// maintenance deletes them, so the keys kept are about one window's.
func SetIdempotencyWindow(ctx context.Context, db DB, id int, window time.Duration) error {
	if window <= 0 {
		return fmt.Errorf("schema: idempotency window of topic %d: must be positive, got %s", id, window)
	}
	// The UPDATE of the SQL function set_idempotency_window, qualified:
	// the function's body (LANGUAGE sql, not pinned) resolves log_counter
	// through the caller's search_path, which finds another schema's, or
	// none, when pgevents is not in the first schema of it.
	if _, err := db.Exec(ctx, SQL(ctx, `UPDATE {schema}log_counter SET idempotency_window = $2::interval WHERE topic_id = $1`), id, window.String()); err != nil {
		return fmt.Errorf("schema: idempotency window of topic %d: %w", id, err)
	}
	return nil
}

// Offset allocations of a topic; see migration 0006.
const (
	// AllocationCounter draws offsets from the topic's counter row: gapless
	// and commit-ordered; appends slow down while a snapshot stays open.
	AllocationCounter = "counter"
	// AllocationSequence draws them from a sequence under an advisory
	// lock: commit-ordered, with a gap for each rolled-back append; an open
	// snapshot costs nothing.
	AllocationSequence = "sequence"
)

// SetAllocation switches topic id's offset allocation, continuing from its
// next offset; it waits for the appends in flight.
func SetAllocation(ctx context.Context, db DB, id int, allocation string) error {
	if _, err := db.Exec(ctx, SQL(ctx, `SELECT {schema}set_offset_allocation($1, $2)`), id, allocation); err != nil {
		return fmt.Errorf("schema: set offset allocation of topic %d: %w", id, err)
	}
	return nil
}

// Topic SQL. The counter row is created once, with the topic's first
// layout; its partition count changes only through Repartition, which
// records a new layout: a consumer compares its configuration with the
// current count and refuses to start on a mismatch, because a different
// count sends hosts to other partitions (invariant 5).
const (
	createTopicSQL = `WITH t AS (
    INSERT INTO {schema}log_counter (topic_id, total_partitions, segment_size, offset_scope, channel) VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (topic_id) DO NOTHING
    RETURNING topic_id, total_partitions
), r AS (
    INSERT INTO {schema}topic_retention (topic_id) SELECT topic_id FROM t
), c AS (
    INSERT INTO {schema}partition_counters (topic_id, partition_id)
    SELECT t.topic_id, p FROM t CROSS JOIN generate_series(0, t.total_partitions - 1) AS p
)
INSERT INTO {schema}topic_layouts (topic_id, version, total_partitions, from_offset)
SELECT topic_id, 1, total_partitions, 1 FROM t`

	// setWakeSQL changes a topic's wake-up mode and, when it changed to
	// 'waiting', notifies its channel for every partition ("*"), at commit.
	setWakeSQL = `WITH u AS (
    UPDATE {schema}log_counter SET wake = $2 WHERE topic_id = $1 AND wake <> $2 RETURNING channel
)
SELECT pg_notify(u.channel, $1::integer || ':*') FROM u WHERE $2 = 'waiting'`

	// wakeSQL reads a topic's wake-up mode and channel alone (LookupTopic
	// may wait for appends in flight).
	wakeSQL = `SELECT wake, channel FROM {schema}log_counter WHERE topic_id = $1`

	lookupTopicSQL = `SELECT topic_id, total_partitions, coalesce({schema}topic_next_offset(topic_id), 0), segment_size, allocation, channel,
       CASE WHEN sequenced THEN 'sequenced' ELSE offset_scope END, wake
FROM {schema}log_counter WHERE topic_id = $1`

	// makeSequencedSQL makes a topic just created sequenced: its staging
	// tables and its tick record (migration 0016).
	makeSequencedSQL = `SELECT {schema}make_sequenced($1)`

	// ensureSegmentsSQL runs under a short lock_timeout so that DDL never
	// queues behind a long transaction and, queued, blocks the appends that
	// arrive after it.
	ensureSegmentsSQL = `SELECT {schema}ensure_outbox_segments($1, $2)`
)

// SegmentsAhead is how many segments of outbox_message_t are kept created
// beyond the one the counter is in.
const SegmentsAhead = 2

// DefaultSegmentSize is the number of offsets per segment of a topic's log
// unless EnsureTopic is told otherwise.
const DefaultSegmentSize = 1000000

// EnsureTopic creates topic id with the given partition count and scope
// ScopeTopic when it does not exist yet; see EnsureTopicSpec.
func EnsureTopic(ctx context.Context, db DB, id, partitions int, segmentSize ...int) (Topic, bool, error) {
	spec := TopicSpec{ID: id, Partitions: partitions}
	if len(segmentSize) > 0 {
		spec.SegmentSize = segmentSize[0]
	}
	return EnsureTopicSpec(ctx, db, spec)
}

// EnsureTopicSpec creates the topic spec describes when it does not exist
// yet, creates its tables, and returns the topic as the database records
// it, and whether it was created here. A topic that exists keeps its
// partition count, segment size and scope, whatever spec says: the caller
// compares.
func EnsureTopicSpec(ctx context.Context, db DB, spec TopicSpec) (Topic, bool, error) {
	if spec.SegmentSize <= 0 {
		spec.SegmentSize = DefaultSegmentSize
	}
	if spec.Scope == "" {
		spec.Scope = ScopeTopic
	}
	if spec.Channel == "" {
		spec.Channel = ChannelFor(Name(ctx))
	}
	var created bool
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		scope := spec.Scope
		if scope == ScopeSequenced {
			scope = ScopePartition // and sequenced (make_sequenced)
		}
		tag, err := tx.Exec(ctx, SQL(ctx, createTopicSQL), spec.ID, spec.Partitions, spec.SegmentSize, scope, spec.Channel)
		if err != nil {
			return err
		}
		created = tag.RowsAffected() == 1
		if created && spec.Scope == ScopeSequenced {
			_, err = tx.Exec(ctx, SQL(ctx, makeSequencedSQL), spec.ID)
		}
		return err
	})
	if err != nil {
		return Topic{}, false, fmt.Errorf("schema: create topic %d: %w", spec.ID, err)
	}
	if _, err := EnsureSegments(ctx, db, spec.ID); err != nil {
		return Topic{}, created, err
	}
	t, err := LookupTopic(ctx, db, spec.ID)
	return t, created, err
}

// ensureSegmentsTimeout bounds EnsureSegments when its context has no
// deadline.
const ensureSegmentsTimeout = 2 * time.Minute

// LookupTopic returns topic id, or an error wrapping ErrTopicNotFound.
func LookupTopic(ctx context.Context, db DB, id int) (Topic, error) {
	var t Topic
	err := db.QueryRow(ctx, SQL(ctx, lookupTopicSQL), id).Scan(&t.ID, &t.Partitions, &t.NextOffset, &t.SegmentSize, &t.Allocation, &t.Channel,
		&t.Scope, &t.Wake)
	if errors.Is(err, pgx.ErrNoRows) {
		return Topic{}, fmt.Errorf("schema: topic %d: %w", id, ErrTopicNotFound)
	}
	if err != nil {
		return Topic{}, fmt.Errorf("schema: look up topic %d: %w", id, err)
	}
	return t, nil
}

// EnsureSegments creates the segments of outbox_message_t that the topic's
// counter will reach next, and returns how many it created. It waits at most
// a second for each lock and then gives up with an error; the DEFAULT
// partition holds events meanwhile, so callers retry later and lose
// nothing. ctx bounds the whole; without a deadline, ensureSegmentsTimeout
// does (a topic of many partitions creates a few tables for each: 64 of
// them on a loaded 2-core machine took more than 10 s, the bound before).
func EnsureSegments(ctx context.Context, db DB, topicID int) (int, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, ensureSegmentsTimeout)
		defer cancel()
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("schema: ensure segments: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '1s'`); err != nil {
		return 0, fmt.Errorf("schema: ensure segments: %w", err)
	}
	var n int
	if err := tx.QueryRow(ctx, SQL(ctx, ensureSegmentsSQL), topicID, SegmentsAhead).Scan(&n); err != nil {
		return 0, fmt.Errorf("schema: ensure segments of topic %d: %w", topicID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("schema: ensure segments: %w", err)
	}
	return n, nil
}

// Repartition changes topic id's partition count to partitions from the
// next offset on, without stopping producers, and returns that offset (the
// cut). Consumer groups finish the old layout up to the cut before they
// handle the new one. It then creates the new layout's segments
// (EnsureSegments), so that the events appended from now on land in their
// partitions' tables, where consumers read them at once: left to the next
// maintenance pass, they waited in the log's DEFAULT partition, and their
// partitions' workers retried, for seconds. When that fails, the
// repartition stands (the cut is returned) and the error is a
// *SegmentsPendingError: the caller must treat the topic as repartitioned.
func Repartition(ctx context.Context, db DB, id, partitions int) (int64, error) {
	var cut int64
	if err := db.QueryRow(ctx, SQL(ctx, `SELECT {schema}repartition_topic($1, $2)`), id, partitions).Scan(&cut); err != nil {
		return 0, fmt.Errorf("schema: repartition topic %d: %w", id, err)
	}
	if _, err := EnsureSegments(ctx, db, id); err != nil {
		return cut, &SegmentsPendingError{Topic: id, Err: err}
	}
	return cut, nil
}

// SegmentsPendingError says that a change to a topic committed, but the
// segments of its new partitions could not be created yet (a lock was not
// granted within EnsureSegments' bound). The change stands: maintenance
// creates the segments at its next pass, and events appended meanwhile
// wait in the log's DEFAULT partition, where nothing is lost. Callers that
// track the topic's partition count must count the change as done (find it
// with errors.As).
type SegmentsPendingError struct {
	// Topic is the topic that changed.
	Topic int
	// Err is why the segments were not created.
	Err error
}

// Error says that the change stands and what is left to maintenance.
func (e *SegmentsPendingError) Error() string {
	return fmt.Sprintf("schema: topic %d repartitioned, but its new partitions' segments are left to the next maintenance pass: %v", e.Topic, e.Err)
}

// Unwrap returns why the segments were not created.
func (e *SegmentsPendingError) Unwrap() error { return e.Err }

// Segment is a table of outbox_message_t holding the offsets [Lo, Hi) of
// one partition of a topic.
type Segment struct {
	Name      string
	Partition int
	Lo, Hi    int64
}

// segmentsSQL lists a topic's segments: the partitions of the partitions
// of pgevents' outbox_message_t (ensure_outbox_segments names them
// outbox_message_t_<topic>_p<partition>_<k> and gives segment k the offsets
// [k*size + 1, (k+1)*size + 1) of the partition). Found through
// pg_inherits from the log itself, so that tables of the same names in
// other schemas are never taken for pgevents'.
const segmentsSQL = `SELECT c.relname::text, substring(c.relname FROM '_p(\d+)_\d+$')::int,
       substring(c.relname FROM '_(\d+)$')::bigint, lc.segment_size
FROM pg_inherits top
JOIN pg_class parent ON parent.oid = top.inhrelid
JOIN pg_inherits i ON i.inhparent = parent.oid
JOIN pg_class c ON c.oid = i.inhrelid
JOIN {schema}log_counter lc ON lc.topic_id = $1
WHERE top.inhparent = '{schema}outbox_message_t'::regclass
  AND parent.relname ~ ('^outbox_message_t_' || $1 || '_p\d+$')
  AND c.relname ~ ('^outbox_message_t_' || $1 || '_p\d+_\d+$')
ORDER BY 2, 3`

// Segments returns the topic's segments, by partition and offset.
func Segments(ctx context.Context, db DB, topicID int) ([]Segment, error) {
	rows, err := db.Query(ctx, SQL(ctx, segmentsSQL), topicID)
	if err != nil {
		return nil, fmt.Errorf("schema: segments of topic %d: %w", topicID, err)
	}
	var (
		out  []Segment
		name string
		p    int
		k    int64
		size int64
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &p, &k, &size}, func() error {
		out = append(out, Segment{Name: name, Partition: p, Lo: k*size + 1, Hi: (k+1)*size + 1})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("schema: segments of topic %d: %w", topicID, err)
	}
	return out, nil
}

// ErrTopicNotEmpty is returned by SetSegmentSize for a topic that holds
// events.
var ErrTopicNotEmpty = errors.New("topic is not empty")

// SetSegmentSize changes the number of offsets per segment of a topic that
// holds no event yet: its segments are dropped and created again, the
// segment of every partition's next offset and ahead more beyond it.
func SetSegmentSize(ctx context.Context, db DB, topicID int, size int64, ahead int) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("schema: segment size of topic %d: %w", topicID, err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // no-op after Commit
	var events bool
	if err := tx.QueryRow(ctx, SQL(ctx, `SELECT EXISTS (SELECT 1 FROM {schema}outbox_message_t WHERE topic_id = $1)`), topicID).Scan(&events); err != nil {
		return fmt.Errorf("schema: segment size of topic %d: %w", topicID, err)
	}
	if events {
		return fmt.Errorf("schema: segment size of topic %d: %w", topicID, ErrTopicNotEmpty)
	}
	segs, err := Segments(ctx, tx, topicID)
	if err != nil {
		return err
	}
	for _, s := range segs {
		if _, err := tx.Exec(ctx, `DROP TABLE `+Ident(ctx, s.Name)); err != nil {
			return fmt.Errorf("schema: segment size of topic %d: %w", topicID, err)
		}
	}
	if _, err := tx.Exec(ctx, SQL(ctx, `UPDATE {schema}log_counter SET segment_size = $2 WHERE topic_id = $1`), topicID, size); err != nil {
		return fmt.Errorf("schema: segment size of topic %d: %w", topicID, err)
	}
	if _, err := tx.Exec(ctx, SQL(ctx, ensureSegmentsSQL), topicID, ahead); err != nil {
		return fmt.Errorf("schema: segment size of topic %d: %w", topicID, err)
	}
	return tx.Commit(ctx)
}

// Retention is how long a topic keeps its events; see topic_retention.
type Retention struct {
	// Retention: events every ACTIVE or PAUSED group has handled.
	Retention time.Duration
	// Max caps how long any event is kept, whatever the groups; 0: no cap.
	Max time.Duration
	// ZeroSubscription: how long a topic without subscriptions keeps
	// events.
	ZeroSubscription time.Duration
}

// SetRetention records the topic's retention settings.
func SetRetention(ctx context.Context, db DB, topicID int, r Retention) error {
	var max *string
	if r.Max > 0 {
		m := r.Max.String()
		max = &m
	}
	_, err := db.Exec(ctx, SQL(ctx, `INSERT INTO {schema}topic_retention (topic_id, retention, max_retention, zero_subscription_retention)
VALUES ($1, $2::interval, $3::interval, $4::interval)
ON CONFLICT (topic_id) DO UPDATE SET retention = excluded.retention, max_retention = excluded.max_retention,
    zero_subscription_retention = excluded.zero_subscription_retention`),
		topicID, r.Retention.String(), max, r.ZeroSubscription.String())
	if err != nil {
		return fmt.Errorf("schema: set retention of topic %d: %w", topicID, err)
	}
	return nil
}
