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
// Offsets are allocated per topic in one of three scopes, chosen when the
// topic is created:
//
//   - scope topic (the default): one sequence for the
//     topic. An append takes the topic's append lock (an advisory lock),
//     reads the topic's tail (the highest offset committed) and writes the
//     offsets after it, holding the lock until the transaction ends, so
//     offsets are gapless and commit-ordered across the topic, and every
//     producer of the topic waits for the one before it to commit
//     (allocation 'sequence' draws them from a sequence instead: gaps for
//     rollbacks);
//   - scope partition: one sequence per partition, under the partition's
//     append lock, taken in ascending order by a call that appends to
//     several, so offsets are gapless and commit-ordered per partition, as
//     in Kafka, and producers of different partitions never wait for each
//     other;
//   - scope sequenced: one sequence per partition, assigned after commit.
//     An append inserts the event into the topic's staging table, with no
//     lock and no tail read, and returns a sequence number; the topic's
//     sequencer (Sequence: one process at a time, under an advisory lock)
//     moves what committed into the log in ticks, in commit order at the
//     tick's granularity, a transaction's events contiguous per partition.
//     Everything that reads the log then sees a topic of scope partition.
//     The rules on locks, isolation and deadlocks below do not apply to it.
//
// The tails are rows of partition_tails, inserted by each append call and
// never updated: no row is updated per append, so a snapshot held open
// elsewhere (a report, pg_dump) does not slow appends down (an updated row
// keeps every version while such a snapshot lives, and each lookup walks
// them). A visible offset implies that every lower offset of its sequence
// is committed or rolled back (and then taken again by the next append),
// and the events of one producer transaction in one partition are
// contiguous. Append as late in the transaction as possible, in READ
// COMMITTED (others are refused: the tail must be read after the lock), to
// several topics in a fixed order, with one call per topic (two calls can
// lock partitions out of order and deadlock, see Append), and never under
// two-phase commit (NOTIFY forbids PREPARE TRANSACTION).
//
// # Wake-ups
//
// A notification at commit takes a database-wide lock held until the
// commit's WAL flush, so notifying transactions commit one after another.
// Producers therefore notify only partitions a consumer sleeps on, and while
// events flow nobody sleeps: one consumer per topic and database, the
// elected watcher, reads the topic's appends counter every 0.1 to 1 ms and,
// when it moved, the tails of the awake partitions (rows of
// partition_tails), hints its own workers and tells the other consumers
// which partitions moved in one notification per look. A quiet partition
// goes to sleep: the watcher holds its sleep key, and the next append to it
// notifies. No event waits for the poll, which stays as the safety net for
// lost notifications. The protocol, the tables and keys it uses and why it
// is race-free: see docs/concepts.md, "How a sleeping partition wakes".
//
// A partition that is not eligible (its group paused, the partition
// halted, its lease elsewhere) ignores what the watcher says of it. Every
// change that makes it eligible again (a resume, also of a consumer that
// started paused; an unhalt; a lease gained; a layout switched; the wake-up
// mode back to waiting) wakes it in one place, Consumer.eligible: the
// consumer polls at once and its watcher reads the tails again. The
// operator's commands that make partitions eligible (offsets.Resume,
// offsets.Unhalt, offsets.Reset) and a layout switch notify the topic's
// consumers at their commit ("<topic>:*"), and a consumer then reads its
// group's state at once (Consumer.recheck): the next event is handled
// within milliseconds of the command.
//
// # Consuming
//
// A [Consumer] serves one group on one topic: a worker per partition whose
// lease it holds (the live replicas of a group share the partitions; see the
// partition package). A worker wakes on a notification naming its
// partition, on a poll every WaitPeriod, or after the listener reconnects,
// and then, in one transaction:
//
//  1. takes the group's position lock of the partition (an advisory lock)
//     and reads up to BatchSize events from the group's position there,
//     with the lease it holds and the group's state (a paused group's
//     claim rolls back: a pause waits for the batches in flight, so nothing
//     is handled after it returns);
//  2. extends the batch to the end of the producer transaction of its last
//     event, reading further chunks so that memory stays bounded;
//  3. runs the registered [Handler] of each event with that transaction;
//  4. records the position past the last event (a new row of
//     consumer_positions: positions, too, are never updated) and commits,
//     in one round trip.
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
//     transaction that moves the offset past it; after one, each unit runs
//     in a savepoint until a batch commits without a failure, so the next
//     failing units are dead-lettered in the attempt that meets them. See
//     [Classify].
//
// Every transaction on the consumer's side runs READ COMMITTED, whatever
// the role's or the database's default: a position or a lease is read
// after its lock, in a snapshot that sees what the lock's previous holder
// committed (under REPEATABLE READ the snapshot would be older than the
// lock, and a batch that waited for an operator's reset would undo it).
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
// dead-lettered as if its handler had failed. The relays in sink/kafkasink and
// sink/webhook are built this way: at least once, in order per host.
//
// # Layers
//
// pgevents is built in layers, as pgx is: a package imports only packages
// of the layers before it, never one above, so each can be used, read and
// tested on its own. In import order:
//
//  1. schema and pgeventstype: the migrations, topics and the one database
//     interface (schema.DB); the types every layer shares.
//  2. The engine, internal/store (the log's SQL: claims, commits, positions,
//     resets, dead letters, wake-ups, retention) and internal/lease (the
//     leaser); internal/netconn. Nothing outside this module imports them.
//  3. The public layers, each usable on its own: batching (pure), listener,
//     partition (the partition function's contract; who owns which
//     partition), offsets (the operator's API: positions and lag, reset,
//     pause/resume/cancel, halts) and adopt. They know nothing of this
//     package.
//  4. This package: events, appends, consumers, handlers, dead letters.
//  5. Above it: metrics, config, sink and the relays (sink/kafkasink,
//     sink/webhook), the Kafka protocol endpoint (kafka, on the public
//     layers only), pgeventstest, the console, and the CLI
//     (cmd/consumer/consumercli), which reaches the engine only through the
//     public layers (a test checks it), and cmd/consumer last.
//  6. cmd/consumer-dev: cmd/consumer plus the development commands, demo
//     and bench, whose packages live under it (cmd/consumer-dev/internal)
//     and are linked by no other binary.
//
// Besides the engine and its helpers (internal/backoff, internal/finetimer,
// internal/netconn, internal/tmpl), internal/ holds only the test harness:
// internal/pgtest and internal/pgcluster (throwaway PostgreSQL databases and
// clusters, which pgeventstest and consumer-dev use too), internal/eventtest
// and internal/sinktest.
//
// This package links no Kafka client: Kafka's error codes are classified in
// sink/kafkasink.
package pgevents
