// Package offsets reads and moves positions in the log: it reserves offsets
// for appends, creates a consumer group's starting positions, claims a
// partition's next batch and commits the offset after it.
//
// # Claiming and committing
//
// A partition worker runs one transaction per batch:
//
//	BEGIN
//	Claim:   lock the group's consumer_offsets row for the partition
//	         (SELECT ... FOR UPDATE) and fetch the events from next_offset
//	         on, in c_offset order, in the same statement
//	Fetch:   read further chunks of a producer transaction that did not fit
//	         (keyset pagination on c_offset; memory stays bounded)
//	         ... handlers run in this transaction ...
//	Commit:  next_offset = last handled offset + 1
//	COMMIT
//
// The row lock orders the batches of one partition: a second process that
// claims the same partition waits for the first one's transaction and then
// reads the advanced next_offset, so batches never interleave and effects
// never double (invariants 2 and 3, listed in package pgevents). The lock
// orders batches but is not ownership: between batches nobody holds it, so
// which replica may claim a partition is decided by its lease
// (internal/partition), checked in the same round trip as the claim
// (leaseHeldSQL) and again at commit, where the epoch fences a replica that
// lost it.
//
// Taking the lock writes WAL even when there is nothing to read, so a worker
// asks [Pending] (or trusts a notification that names a higher offset) before
// it claims.
//
// # Query plans
//
// The claim and fetch statements are prepared and cached per connection, so
// the server may switch them to a generic plan made once. A generic plan
// made while outbox_message_t was empty must not be a sequential scan that
// sticks as the table grows: both statements ask for the partition's rows in
// c_offset order with a LIMIT, which the (topic_id, partition_id, c_offset)
// index answers directly, so the index scan is the cheapest plan whatever the
// statistics say. TestClaimPlanSurvivesGrowth forces a generic plan on an
// empty table and checks that it still reads through the index after the
// table has grown. The cost of the claim does not grow with the number of
// partitions (invariant 6 of package pgevents).
package offsets
