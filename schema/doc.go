// Package schema owns pgevents' database objects: the embedded, versioned SQL
// migrations that create them, and the few statements that manage topics.
//
// # Objects
//
// Migration 0001 creates, in the first schema of the search_path:
//
//   - log_counter: one row per topic holding the next offset to hand out and
//     the topic's partition count. Appends reserve offsets by updating this
//     row and keep it locked until they commit, which makes offsets gapless
//     and commit-ordered.
//   - outbox_message_t: the log, range-partitioned on (topic_id, c_offset)
//     into segments so that retention can drop whole old ranges; the
//     partition of each event is computed once, at append, and indexed with
//     its offset.
//   - consumer_offsets: the next offset to read, per group, topic and
//     partition, updated in the consumer's own transaction.
//   - dead_letter_queue: units that failed permanently, with their reason.
//   - the SQL functions append_event, append_events (usable from any
//     language, inside the caller's transaction), event_partition,
//     reserve_offsets, ensure_outbox_segments, and the statement-level
//     trigger that sends one NOTIFY per append statement on the topic's channel
//     (log_counter.channel, event_channel unless SetChannel says otherwise).
//
// Each migration file states the invariant every object upholds beside it.
//
// # Applying migrations
//
// [Migrate] applies the migrations that the database lacks, in version order,
// in one transaction, after taking a transaction-scoped advisory lock: several
// replicas starting at once apply them exactly once, and a failed migration
// leaves nothing behind. Applied versions are recorded in
// pgevents_schema_migrations. [Script] returns the same SQL for teams that run
// their own migration tool.
package schema
