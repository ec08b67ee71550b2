// Package offsets is the operator's API over a consumer group's positions:
// where each partition of a group stands, moving a group (reset), its
// lifecycle (pause, resume, cancel) and its halted partitions. The CLI's
// `offsets` and `group` commands and the console use it, and so can a
// service's own tools.
//
// # Positions
//
// A group's position in a partition is the next offset it reads, Kafka
// style: a worker handles a batch and writes the position past its last
// event in the batch's own transaction, so a position never runs ahead of
// the effects in the database (exactly once for database effects). Positions
// reads them with the partition's log end and the group's lag; it takes no
// lock and never waits for a batch.
//
// # Reset
//
// Reset moves every position of a group to a Start (earliest, latest, an
// offset or a time) in one transaction. It takes each partition's position
// lock, as a worker's claim does, so it waits for the batches in flight and
// no batch can commit a position older than the reset's. It refuses while a
// replica of the group is live (ErrGroupRunning) unless forced: with force,
// the live replicas lose their leases, their batch in flight cannot commit,
// and they continue from the new positions. Preview does the same reset in
// a transaction it rolls back, and counts the events each partition would
// replay or skip; Count counts them in a transaction of the caller's that
// ran Reset (to commit only the reset that was shown).
//
// # Lifecycle and halts
//
// A group's subscription is ACTIVE, PAUSED, DEAD (no replica seen for its
// dead_after; it becomes ACTIVE again when one starts) or CANCELLED
// (terminal: its replicas stop and it no longer holds retention back).
// Pause, Resume and Cancel are the operator's transitions, and each is
// idempotent: pausing a paused group succeeds and changes nothing, and so
// does resuming an active one; any other transition is ErrTransition. A
// partition whose handler failed permanently under the halt
// policy stops at the failed offset and records a Halt; Unhalt removes the
// record, and the partition's worker retries from its position; a Reset
// that moves the position past the halt removes it too.
//
// Resume (every change of state), Unhalt and Reset tell the group's
// running consumers at their commit (a notification on the topic's
// channel): they follow within milliseconds, not at their next heartbeat.
//
// # Audit
//
// Audit records an operator's action in the console_audit table, which the
// console's pages show: the console's actions and the CLI's (group pause,
// resume and cancel, offsets reset, dlq replay and discard), each with its
// origin and actor. It is the table's one writer.
//
// Every function takes a schema.DB (a pool, a connection or a transaction:
// in a transaction, the function's own work runs in a savepoint of it) and
// names pgevents' tables in the schema the context carries (schema.WithName).
// Every write goes through pgevents' engine, which takes the locks a worker
// takes; Positions, Count and Audit run the statements of sql.go. The
// errors an operator meets (a refused transition or reset, a group without
// a subscription) name no package: the CLI and the console show them as
// they are.
package offsets
