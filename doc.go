// Package pgevents makes a PostgreSQL table a partitioned, Kafka-like event
// log with consumer groups.
//
// # Appending
//
// A service appends events inside its own business transaction, with
// [Append] (or [AppendCommit], which pipelines the append with COMMIT) from
// Go or the SQL functions append_event and append_events from any language.
// Each event's partition, abs(hashtext(host_id)) % partitions, is computed
// once, in SQL, at append, and stored; a partition's rows are stored
// together, in a table of their own split into segments of offsets.
//
// Offsets come from a counter, in one of two scopes chosen per topic:
//
//   - scope topic (the default, the seed design's): one counter per topic.
//     An append reserves offsets by updating it and holds its lock until the
//     transaction ends, so offsets are gapless and commit-ordered across the
//     topic, and every producer of the topic waits for the one before it to
//     commit (allocation 'sequence' trades gaplessness for immunity to long
//     open snapshots);
//   - scope partition: one counter per partition, locked in ascending order
//     by a transaction that appends to several, so offsets are gapless and
//     commit-ordered per partition, as in Kafka, and producers of different
//     partitions never wait for each other.
//
// Either way a visible offset implies that every lower offset of its
// sequence is committed or rolled back along with its reservation, and the
// events of one producer transaction in one partition are contiguous.
// Append as late in the transaction as possible, in READ COMMITTED
// (REPEATABLE READ producers get serialization failures), to several topics
// in a fixed order, and never under two-phase commit (NOTIFY forbids
// PREPARE TRANSACTION).
//
// # Wake-ups
//
// A notification at commit takes a database-wide lock held until the
// commit's WAL flush, so notifying transactions commit one after another.
// Appends therefore notify only partitions whose worker may be waiting: a
// worker that finds nothing more to do sets its partition's waiting flag
// (partition_counters.waiting), and the next append to the partition sends
// one notification and clears the flag. Producers of busy partitions send
// none. The race between an append that read the flag clear and a worker
// that sets it is closed by the worker, which, before it sleeps,
//
//  1. sets the flag and commits: appends that read it later notify;
//  2. waits for every append in flight that read the flag before step 1:
//     each holds its append lock (the topic's counter row or advisory
//     lock, or under scope partition the partition's counter row) until
//     it ends;
//  3. looks for events once more: what such an append committed is
//     visible.
//
// Under scope partition the flag is a column of the partition's counter
// row, so setting it waits for the append holding the row: steps 1 and 3
// take one round trip. Under scope topic the lock is the topic's, held by
// whichever append runs, for any partition: the worker runs steps 1 and 3
// and sleeps, and one goroutine of the consumer runs steps 2 and 3 for
// every worker that went idle meanwhile (a share lock on the counter row,
// released at once, then one look at all their partitions), waking those
// that have work. A worker thus never sits out another partition's commit,
// and a notification that arrives meanwhile is taken at once.
//
// So no event waits for the poll: it is announced, or found in step 3.
// Polling every WaitPeriod stays as the safety net for lost notifications.
//
// # Consuming
//
// A [Consumer] serves one group on one topic: a worker per partition whose
// lease it holds (the live replicas of a group share the partitions; see the
// partition package). A worker wakes on a notification naming its
// partition, on a poll every WaitPeriod, or after the listener reconnects,
// and then, in one transaction:
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
// Notifications are hints and may be lost; polling is the truth. Anyone
// who can connect may notify a topic's channel, with any payload: a
// notification may make a worker look sooner, never move its position or a
// bound it trusts past what the database shows. A claim that finds nothing
// leaves the worker where the database says it is. See the listener package
// for how the listening connection is kept healthy.
//
// # Effects outside PostgreSQL
//
// A handler whose effect happens elsewhere (a Kafka record, an HTTP
// request) cannot commit it with the offset. It may still run its effects
// concurrently across the batch instead of one round trip per event: with
// [BatchFromContext] it registers a [Flusher] on the batch, starts the
// effect and returns; before the offset commits, the consumer flushes
// every Flusher and commits only if every effect succeeded, and a failed
// effect is blamed on its event's unit ([EventError]), retried or
// dead-lettered as if its handler had failed. The relays in sink/kafka and
// sink/http are built this way: at least once, in order per host.
package pgevents
