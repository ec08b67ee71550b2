package consumercli

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/pgevents/pgevents/schema"
)

// repartitionCmd changes a topic's partition count online.
func repartitionCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "repartition", "--partitions N [--topic T] [--config FILE]",
		"Changes a topic's partition count online: running consumers finish every old partition up to the change, then move to the new layout by themselves.")
	path := fs.String("config", defaultConfigPath, "configuration file: its databaseUrl, and topicId when --topic is not given")
	topic := fs.Int("topic", 0, "topic to repartition (default: the configuration's topicId)")
	partitions := fs.Int("partitions", 0, fmt.Sprintf("the new partition count, 1 to %d", schema.MaxPartitions))
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("repartition: unexpected argument %q", fs.Arg(0))
	}
	if err := schema.ValidPartitions(*partitions); err != nil {
		return usagef("repartition: --partitions %v", err)
	}
	ctx, _, pool, err := connect(ctx, *path, topic)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := knownTopic(ctx, pool, *topic, *path); err != nil {
		return err
	}
	before, err := schema.LookupTopic(ctx, pool, *topic)
	if err != nil {
		return err
	}
	cut, err := schema.Repartition(ctx, pool, *topic, *partitions)
	var pending *schema.SegmentsPendingError
	switch {
	case errors.As(err, &pending):
		// The repartition committed: say so (exit 0), and what is left.
		fmt.Fprintf(stderr, "consumer: warning: %v\n", err)
	case err != nil:
		return err
	}
	// Under scope partition each partition has its own cut: its next
	// offset at the change (schema.Repartition returns 0).
	from, upTo := fmt.Sprintf("from offset %d", cut), fmt.Sprintf("up to offset %d", cut)
	if before.Scope == schema.ScopePartition || before.Scope == schema.ScopeSequenced {
		from, upTo = "from each partition's next offset", "up to its offset at the change"
	}
	fmt.Fprintf(stdout, `topic %d: %d -> %d partitions %s.
Running consumers finish every old partition %s, then move to the new layout by themselves.
Set totalPartitions: %d in the configuration of every consumer of topic %d before they restart:
a consumer configured with another count refuses to start.
`, *topic, before.Partitions, *partitions, from, upTo, *partitions, *topic)
	return nil
}
