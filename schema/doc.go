// Package schema owns pgevents' database objects: the embedded, versioned SQL
// migrations that create them, and the few statements that manage topics.
//
// # Objects
//
// The migrations create, in pgevents' schema (see WithName: a schema of its
// own, or the first schema of the search_path):
//
//   - log_counter: one row per topic: its partition count, offset scope
//     ('topic' or 'partition'), allocation, channel, wake-up mode and, under
//     scope 'topic', the next offset to hand out. Appends reserve offsets by
//     updating it and keep it locked until they commit, which makes offsets
//     gapless and commit-ordered across the topic.
//   - partition_counters: one row per partition: its next offset under scope
//     'partition' (the same guarantee, per partition, with no lock shared
//     across partitions) and its waiting flag (appends notify a partition
//     only while its worker may be waiting).
//   - outbox_message_t: the log, partitioned by (topic_id, partition_id)
//     into one table per partition of a topic, each partitioned by c_offset
//     into segments that retention drops whole; the partition of each event
//     is computed once, at append, and a partition's rows are stored
//     together.
//   - consumer_offsets: the next offset to read, per group, topic and
//     partition, updated in the consumer's own transaction.
//   - dead_letter_queue: units that failed permanently, with their reason.
//   - the SQL functions append_event and append_events (usable from any
//     language, inside the caller's transaction, notifying the channel of
//     the topic, log_counter.channel, for waiting partitions),
//     event_partition, reserve_offsets, ensure_outbox_segments,
//     repartition_topic, layout_start and layout_cut.
//
// Each migration file states the invariant every object upholds beside it.
//
// # Applying migrations
//
// [Migrate] applies the migrations that the database lacks, in version order,
// in one transaction, after taking a transaction-scoped advisory lock: several
// replicas starting at once apply them exactly once, and a failed migration
// leaves nothing behind. Applied versions are recorded in
// pgevents_schema_migrations. [Script] and [ScriptIn] return the same SQL for
// teams that run their own migration tool.
//
// # A schema of its own
//
// With a schema name on the context ([WithName]), Migrate creates the schema
// and every object in it, and every statement of pgevents' packages names
// its objects there, qualified ([Marker], [SQL]): pgevents installs beside
// an application's tables of the same names, and handlers, which run the
// application's SQL on pgevents' connections, keep the application's
// search_path. The PL/pgSQL functions pin their search_path to the schema
// they live in, so append_event called schema-qualified finds pgevents'
// objects from any session.
package schema
