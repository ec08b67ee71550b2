// Package partition decides which partitions a consumer process serves.
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
// # Assignment
//
// In this version a process serves either one configured partition (the seed
// design's partitionId) or every partition of the topic. Two processes that
// serve the same partition do not interleave batches: the group's
// consumer_offsets row lock orders them, so the second waits as a standby.
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
