// Package schema owns pgevents' database objects: the embedded, versioned SQL
// migrations that create them, and the few statements that manage topics.
//
// # Objects
//
// The migrations (migrations/*.sql) are the history: each states the
// invariant its objects uphold and why it changed them. The current
// definition of every table, view and function is in schema/current, one
// file per concern, generated from a migrated database by `make schema` and
// checked by TestCurrentSchema in `make test`, so it cannot drift:
//
//   - log.sql: log_counter, one row per topic (its partition count, offset
//     scope 'topic' or 'partition', allocation, channel, wake-up mode,
//     idempotency window, whether it is sequenced); partition_counters, one
//     row per partition (its log start; its waiting column stays true for
//     bridges that adopt installed before migration 0009); partition_tails, the offsets appends inserted, never
//     updated, whose newest row per partition is the partition's tail (the
//     next offset is the tail + 1, read under an advisory lock held to the
//     append's commit: gapless and commit-ordered); outbox_message_t, the
//     events, partitioned by (topic_id, partition_id) and each partition
//     into offset segments that retention drops whole; lock_key, which
//     names every advisory lock of this installation.
//   - append.sql: append_event and append_events (callable from any
//     language, in the caller's READ COMMITTED transaction) and what they
//     dispatch to: append_one, append_many, append_keyed_one; idempotency
//     keys.
//   - sequenced.sql: sequenced topics, whose appends stage events without a
//     lock held through the commit and whose sequencer gives them offsets
//     (staged_events, sequence_tick).
//   - wake.sql: the sleep and flight advisory locks and the notifications
//     that wake a sleeping partition (mark_flight, await_flight,
//     wake_sleepers); the protocol is described once, in docs/concepts.md,
//     "How a sleeping partition wakes".
//   - positions.sql: consumer_positions, one row inserted per batch (a
//     group's position is its newest row), the claim (claim_state) and the
//     commit (commit_position) of a batch, and consumer_offsets, a view of
//     the newest positions kept for tools that read it.
//   - ownership.sql, layouts.sql, failures.sql, maintenance.sql, tools.sql:
//     leases and replicas, repartitioning, dead letters and parked events,
//     retention and samples, the console's audit and the Kafka endpoint's
//     gateways.
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
