package schema

import "fmt"

// MinSegmentSize is the fewest offsets a segment of a topic's log may
// span: the CHECK on the topic's segment size.
const MinSegmentSize = 1000

// DefaultPartitions is the partition count of a topic whose creator does
// not choose one: totalPartitions' default in db-event-consumer.yml (so
// consumer migrate's), and pgeventstest's.
const DefaultPartitions = 8

// MaxPartitions is the largest partition count a topic may have: the
// CHECK on the partition count of log_counter and of every layout.
const MaxPartitions = 1024

// ValidPartitions reports why n cannot be a topic's partition count, or
// nil: it must be between 1 and MaxPartitions. It is the one rule for a
// partition count, wherever one is given (pgevents.Config.TotalPartitions,
// totalPartitions in the YAML file, consumer repartition, adopt).
func ValidPartitions(n int) error {
	if n < 1 || n > MaxPartitions {
		return fmt.Errorf("must be between 1 and %d, got %d", MaxPartitions, n)
	}
	return nil
}
