// Package batching decides where a consumer batch ends and how a batch is
// split for delivery to handlers.
//
// The package is pure: it does no I/O, knows nothing about the database and
// is generic over the event type. A [Keys] value tells it how to read the
// three grouping keys of an event: the producer transaction id, the host id
// and the user id.
//
// # Why batches end at producer-transaction boundaries
//
// A consumer worker reads one logical partition in offset order (c_offset
// ascending). Every event carries the id of the producer transaction that
// appended it, and the events of one producer transaction are contiguous in a
// partition. A producer transaction is the unit of atomicity the producer
// asked for, so the consumer must never deliver part of it in one batch and
// the rest in another: if the worker committed its offset in the middle of a
// transaction and crashed, or if two halves were handled with different
// outcomes, a consumer could observe a state the producer never wrote. A batch
// therefore ends at a transaction's end: it holds batchSize events or fewer,
// ending before the transaction that would take it past batchSize, and goes
// past batchSize only when it is one transaction larger than batchSize,
// read in chunks. So the rows a batch reads beyond its end are at most one
// transaction's, and the next batch reads them again, instead of a chunk.
//
// # Units and runs
//
// A unit is the partition-local slice of one producer transaction: a maximal
// sequence of consecutive events with the same transaction id ([Units],
// [EachUnit]). A run is a maximal sequence of consecutive events with the same
// (host id, user id) inside a unit ([Runs], [EachRun]); group handlers receive
// a whole run at once, so per-user work can be batched. Units and runs are
// sub-slices of the caller's slice; nothing is copied, and [EachUnit] and
// [EachRun] do not allocate.
//
// # Extension with bounded memory
//
// The worker fetches batchSize+1 rows (LIMIT batchSize+1). The extra row is a
// peek that answers "does the transaction of row batchSize-1 continue?"
// without a further query. [Cut] looks at the rows:
//
//   - Fewer than batchSize+1 rows: the partition is exhausted; all rows form
//     the batch and the worker is caught up (more is false).
//   - The peeked row belongs to another transaction: the batch is the first
//     batchSize rows and more work is waiting (more is true).
//   - The peeked row belongs to the same transaction, which began after the
//     first row: the batch ends before that transaction, which starts the
//     next batch (more is true).
//   - The peeked row belongs to the same transaction, which began at the
//     first row: it is part of the batch (n is batchSize+1) and extend is
//     true: the transaction, larger than batchSize, may continue past what
//     was fetched.
//
// While extend is true the worker handles the rows it has, then fetches the
// next chunk with keyset pagination (WHERE c_offset > last handled offset
// ORDER BY c_offset LIMIT chunk+1) and passes it to [Continue] together with
// the transaction id being extended. Continue returns how many leading rows
// still belong to that transaction and whether another chunk must be read. At
// most batchSize+1 or chunk+1 rows are held at any time, so a producer
// transaction of any size is handled with bounded memory. The worker commits
// its offset only after the last chunk, when extend is false, so a crash
// replays the whole transaction and never half of it.
//
// A run that spans a chunk boundary is necessarily delivered in pieces, one
// per chunk; consecutive pieces carry the same (host id, user id).
//
// # Worked example
//
// With batchSize 3 and chunk 2, take a partition holding the transactions
// (offset:tx) 1:A 2:B 3:B 4:B 5:B 6:B 7:C.
//
//	fetch offset>0 LIMIT 4  -> 1:A 2:B 3:B 4:B  Cut: n=1 more=true     (4 is B like 3; B began at 2)
//	batch 1 = 1 (unit A); commit offset 1
//	fetch offset>1 LIMIT 4  -> 2:B 3:B 4:B 5:B  Cut: n=4 extend=true   (B began at the first row)
//	fetch offset>5 LIMIT 3  -> 6:B 7:C          Continue(B): n=1 extend=false more=true
//	batch 2 = 2..6 (unit B); commit offset 6
//	fetch offset>6 LIMIT 4  -> 7:C              Cut: n=1 extend=false more=false
//	batch 3 = 7 (unit C); commit offset 7; caught up, wait for a notification
package batching
