// Package store reads and moves positions in the log: it reserves offsets
// for appends, creates a consumer group's starting positions, claims a
// partition's next batch and commits the offset after it.
//
// # Claiming and committing
//
// A partition worker runs one transaction per batch:
//
//	BEGIN
//	Claim:   take the group's position lock of the partition (an advisory
//	         lock, lock_position), read the events from the group's
//	         position on, in c_offset order, and check the lease, the
//	         group's state and the position, in the same round trip and
//	         four statements (first waiting, when asked, for the append in
//	         flight on the partition to commit: Claim.AwaitAppend)
//	Fetch:   read further chunks of a producer transaction that did not fit
//	         (keyset pagination on c_offset; memory stays bounded)
//	         ... handlers run in this transaction ...
//	CommitBatch: insert the position past the last handled offset, if the
//	         lease is still the batch's, and COMMIT, in one round trip
//
// The position lock orders the batches of one partition: a second process
// that claims the same partition waits for the first one's transaction and
// then reads the position it committed, so batches never interleave and
// effects never double (invariants 2 and 3, listed in package pgevents).
// Every other writer of a position (a reset, a layout switch, the
// dead-letter admin) takes the same lock. The lock orders batches but is not
// ownership: between batches nobody holds it, so which replica may claim a
// partition is decided by its lease (internal/lease), checked in the
// claim's round trip and again at commit, where the epoch fences a replica
// that lost it.
//
// A position is a row of consumer_positions; each batch inserts one and
// none is updated (consumer_offsets is a view of the newest). An advisory
// lock writes nothing, so a claim that finds nothing costs a round trip and
// no WAL; still, a worker claims only when it knows of an offset beyond its
// position (a tail, a notification, a poll) or of an append in flight.
//
// # Wake-ups
//
// See wake.go: the tails, the appends counter, the flight and sleep keys.
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
package store
