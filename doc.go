// Package pgevents makes a PostgreSQL table a partitioned, Kafka-like event
// log with consumer groups.
//
// # Appending
//
// A service appends events inside its own business transaction, with
// [Append] from Go or the SQL functions append_event and append_events from
// any language. Each topic has a counter row; an append reserves offsets by
// updating it and holds its lock until the transaction ends, so offsets
// (c_offset) are gapless and commit-ordered: a visible offset implies that
// every lower offset is committed or rolled back along with its reservation,
// and the events of one producer transaction are contiguous. Each event's
// partition, abs(hashtext(host_id)) % partitions, is computed once, in SQL, at
// append, and stored.
//
// Because producers serialise on the counter row, append as late in the
// transaction as possible, in READ COMMITTED (REPEATABLE READ producers get
// serialization failures), to several topics in a fixed order, and never
// under two-phase commit (NOTIFY forbids PREPARE TRANSACTION).
//
// # Consuming
//
// A [Consumer] serves one group on one topic: a worker per partition whose
// lease it holds (the live replicas of a group share the partitions; see the
// partition package). A worker wakes on a notification naming its partition (sent by the
// append trigger at commit), on a poll every WaitPeriod, or after the
// listener reconnects, and then, in one transaction:
//
//  1. locks the group's consumer_offsets row for the partition and reads up
//     to BatchSize events from its next_offset;
//  2. extends the batch to the end of the producer transaction of its last
//     event, reading further chunks so that memory stays bounded;
//  3. runs the registered [Handler] of each event with that transaction;
//  4. sets next_offset past the last event and commits.
//
// # Guarantees
//
//   - Order: within a group and partition, events are handled in offset
//     order by one worker at a time, whatever the number of processes;
//     hence per-host order, since a host always maps to one partition.
//   - Exactly once for database effects: the handler's statements and the
//     offset commit together or not at all. A crash before commit replays
//     the batch; after commit it never repeats. Effects outside PostgreSQL
//     are at least once: use Event.EventID as their idempotency key.
//   - Transaction atomicity: the events of one producer transaction that
//     fall in one partition are handled in one consumer transaction, even
//     when they outnumber BatchSize.
//   - Nothing skipped, nothing silent: an event is handled, dead-lettered
//     with its reason in dead_letter_queue, or still ahead. A handler error
//     that is transient (connection, serialization, deadlock, lock timeout,
//     a missing table) rolls the batch back and retries it with exponential
//     backoff, forever; a permanent one dead-letters the failing unit (the
//     partition-local slice of one producer transaction) in the same
//     transaction that moves the offset past it. See [Classify].
//
// Notifications are hints and may be lost; polling is the truth. See the
// listener package for how the listening connection is kept healthy.
package pgevents
