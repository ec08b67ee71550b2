// Package partition is the contract of pgevents' partitions: which
// partition an event lands in, which partitions a process serves (Assign),
// and which replica owns each partition of a consumer group (Owners).
//
// # The partition function
//
// An event's partition is abs(hashtext(host_id)::bigint) % total_partitions,
// computed once, in SQL, by the event_partition function when the event is
// appended, and stored in outbox_message_t.partition_id. It is never computed
// in Go: hashtext is internal to PostgreSQL and may differ by platform, and a
// second implementation would be a second truth. Every event of a host lands
// in the same partition, so handling a partition in offset order handles each
// host in order. The bigint cast keeps hashtext = -2147483648 from
// overflowing abs() while giving every other host the seed design's value.
//
// # Ownership
//
// Which replica handles a partition is decided by leases (written by the
// engine's leaser, internal/lease; read here by Owners): a lease per (group,
// topic, partition) with an owner and an epoch, live while its owner's
// replica row (consumer_replicas, which the heartbeat renews, with an expiry
// on the database clock) is. The lease row changes only when it changes
// hands, so the lease checks of every batch read a row that no heartbeat
// updates. In auto mode the live replicas of a group split the partitions
// evenly; in static mode (the seed design's partitionId) a replica takes
// only its configured partitions, and a second one with the same
// configuration waits as a hot standby. A lease whose owner is no longer
// live (the replica died, froze or lost the network) is taken over with a
// higher epoch, and the new owner ends the stale owner's batch if it still
// holds the partition's position lock; the stale owner's commit fails on the
// epoch check. The position lock orders batches; the lease and its epoch
// decide whose batches they are.
package partition

import (
	"fmt"
	"slices"
)

// Assign returns the partitions a process serves: want, sorted and
// deduplicated, or every partition 0..total-1 when want is empty. It returns
// an error when total is not positive or a partition is outside [0, total).
func Assign(total int, want []int) ([]int, error) {
	if total <= 0 {
		return nil, fmt.Errorf("partition: total partitions must be positive, got %d", total)
	}
	if len(want) == 0 {
		all := make([]int, total)
		for i := range all {
			all[i] = i
		}
		return all, nil
	}
	out := slices.Clone(want)
	slices.Sort(out)
	out = slices.Compact(out)
	for _, p := range out {
		if p < 0 || p >= total {
			return nil, fmt.Errorf("partition: partition %d is outside [0, %d)", p, total)
		}
	}
	return out, nil
}
