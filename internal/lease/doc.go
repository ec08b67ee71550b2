// Package lease decides which replica of a consumer group handles which
// partition, and hands a partition over when its replica stops, freezes or
// is cut off: the group's failover.
//
// # Leases
//
// Each partition of a group has one row in partition_leases: its owner (a
// replica id, "" when free) and an epoch. The row changes only when the
// owner does (acquired, released, freed by a reset or a layout switch);
// the epoch grows by one at every acquisition and never goes back, a layout
// switch or a re-subscription included.
//
// Liveness belongs to the replica, not to the lease. A Leaser's heartbeat
// (Run, every Lease/3) renews the replica's consumer_replicas row until now
// + Lease, on the database's clock; a lease is live while its owner's row
// has not expired. So a batch's lease check reads a row no heartbeat
// updates. Every lease statement runs as one statement or one pipelined
// batch without BEGIN, so it completes on the server whatever happens to
// the client: a replica frozen mid-heartbeat holds no lease row locked.
//
// # Sharing the partitions
//
// A heartbeat registers the replica, reads what it owns and lists the live
// replicas of the group (auto mode). Each replica computes its own share
// from that list (Target: the partition count divided by the live
// replicas, sorted by id, the first ones taking one more) without talking
// to the others. Below its share it acquires free leases, or leases whose
// owner is no longer live, bumping their epochs (acquireSQL: SKIP LOCKED,
// so replicas acquiring at once do not wait on each other); above it, it
// asks its Owner to release the highest partitions after their current
// batch (Owner.Release, then Leaser.Released frees the lease). A replica in
// static mode (LeaserConfig.Static) acquires only the partitions it lists.
// At shutdown ReleaseAll frees every lease and removes the replica from
// the live ones, so the others take over at once rather than after Lease.
//
// # Fencing and failover
//
// The epoch is the fencing token. A worker claims a batch under the
// (owner, epoch) it acquired; the claim checks the lease under the
// partition's position lock (store.ErrLeaseLost), and the commit checks it
// again in the same round trip as COMMIT (the SQL commit_position raises
// SQLSTATE PGL01, store.LeaseLostCode, which rolls the batch back). A
// replica whose lease was taken over therefore commits nothing, even when
// it wakes from a freeze in the middle of a batch, and handlers that write
// outside PostgreSQL can compare the epoch (pgevents.Epoch) to refuse a
// stale owner.
//
// When a replica takes a lease over from another (the previous owner's row
// expired), it first ends the previous owner's batch if that batch still
// holds the partition's position lock (Fence: the backend that holds both
// the lock and the previous owner's batch key is terminated), so that the
// new owner's claim does not wait until the server notices a dead peer.
// A batch Fence could not end still holds the lock: the new owner's claim
// waits for it to end, then reads the partition's position as it stands.
//
// A heartbeat also reconciles what the replica believes it holds with the
// database: a lease held here but no longer owned was lost (Owner.Lost: to
// another replica, or freed by the group's reset or layout switch); a lease
// owned but not known here was acquired by a statement whose answer was lost
// (a deadline, a dead connection), and is taken up under the epoch the
// database gave it.
//
// # Guarantees
//
//   - At most one replica can commit a batch of a partition under a given
//     epoch, and a replica that lost its lease commits nothing more.
//   - Epochs only grow, and an acquisition commits synchronously (whatever
//     the session's synchronous_commit), so a server crash cannot hand out
//     the same epoch twice.
//   - A partition whose owner stops heartbeating is taken over within about
//     Lease plus one heartbeat period (Lease/3) by a live replica whose
//     share it falls in; a replica that shuts down hands its partitions
//     over at once.
//   - Leases decide ownership, not order: the position lock orders the
//     batches of a partition (see internal/store), and leases only decide
//     who may claim them.
package lease
