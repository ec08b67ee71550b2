// Package store reads and moves positions in the log: it reserves offsets
// for appends, creates a consumer group's starting positions, claims a
// partition's next batch and commits the offset after it.
//
// # Claiming and committing
//
// A partition worker runs one transaction per batch, in two round trips
// besides its handlers':
//
//	BEGIN
//	Claim:   one statement (migration 0021's claim_state, then the events):
//	         take the owner's batch key and the group's position lock of
//	         the partition (advisory locks), read the lease, the group's
//	         state and the position in a snapshot taken after them, and
//	         the events from the position on, in c_offset order (first
//	         waiting, when asked, for the append in flight on the partition
//	         to commit: Claim.AwaitAppend, a statement before it)
//	Fetch:   read further chunks of a producer transaction that did not fit
//	         (keyset pagination on c_offset; memory stays bounded)
//	         ... handlers run in this transaction ...
//	CommitBatch: insert the position past the last handled offset and
//	         COMMIT, in one round trip
//
// The position lock orders the batches of one partition: a second process
// that claims the same partition waits for the first one's transaction and
// then reads the position it committed, so batches never interleave and
// effects never double (invariants 2 and 3, listed in package pgevents).
// Every other writer of a position (a reset, a layout switch, the
// dead-letter admin) takes the same lock. The lock orders batches but is not
// ownership: between batches nobody holds it, so which replica may claim a
// partition is decided by its lease (internal/lease), checked in the claim
// under the lock; a replica that takes the lease over ends the batch the
// previous owner still runs (lease.Fence finds it by its batch key), and a
// batch it could not end holds the lock, so the new owner's claim waits
// for it and reads the position it committed.
//
// A position is a row of consumer_positions; each batch inserts one and
// none is updated (consumer_offsets is a view of the newest). An advisory
// lock writes nothing, so a claim that finds nothing costs a round trip and
// no WAL; still, a worker claims only when it knows of an offset beyond its
// position (a tail, a notification, a poll) or of an append in flight.
//
// # Wake-ups
//
// wake.go holds the elected watcher's statements (the appends counter, the
// tails, the flight and sleep keys). The protocol, once: see
// docs/concepts.md, "How a sleeping partition wakes".
//
// # Files
//
// Named for the data path's steps: append.go (the producer's statements),
// wake.go (wake-ups), claim.go (the claim and the fetch), position.go (a
// group's position: init, pending, lock, commit), deadletter.go (dead
// letters and parked events), halt.go (halts); and beside them
// subscription.go, layout.go, holders.go, roles.go, sequencer.go,
// retention.go, samples.go.
//
// # Query plans
//
// The claim and fetch statements are prepared and cached per connection.
// The claim runs on its generic plan, made once per connection: a session
// is readied before its first batch (ReadySession sets plan_cache_mode
// force_generic_plan for the session), and the claim gives its own
// transaction auto back, so handlers' statements are planned as anywhere.
// A custom plan of the claim would be planned at every batch (a
// millisecond with a partition's segments). A generic plan made while
// outbox_message_t was empty must not be a sequential scan that sticks as
// the table grows: both statements ask for the partition's rows in
// c_offset order with a LIMIT parameter and a lower bound the plan cannot
// know, which the (topic_id, partition_id, c_offset) index answers
// directly. TestClaimPlanSurvivesGrowth forces a generic plan on an empty
// table and checks that it still reads through the index after the table
// has grown; TestStatementsUseGenericPlans that a readied session runs the
// claim on its generic plan only. The cost of the claim does not grow with
// the number of partitions (invariant 6 of package pgevents).
package store
