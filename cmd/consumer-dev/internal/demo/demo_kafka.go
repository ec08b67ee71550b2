package demo

import (
	"context"
	"fmt"
	"io"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents/sink/kafkasink"
)

// demoKafkaTopic is the topic `consumer demo --sink kafka` relays to, and
// demoKafkaPartitions its partition count.
const (
	demoKafkaTopic      = "demo-events"
	demoKafkaPartitions = 12
)

// demoKafka is the in-process Kafka broker (kfake) of `consumer demo
// --sink kafka` and the relay that feeds it.
type demoKafka struct {
	cluster *kfake.Cluster
	sink    *kafkasink.Sink
}

// startDemoKafka starts the broker and the relay.
func startDemoKafka(stdout io.Writer) (*demoKafka, error) {
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(demoKafkaPartitions, demoKafkaTopic))
	if err != nil {
		return nil, fmt.Errorf("demo: kafka: %w", err)
	}
	s, err := kafkasink.New(kafkasink.Options{Brokers: kc.ListenAddrs(), Topic: demoKafkaTopic})
	if err != nil {
		kc.Close()
		return nil, err
	}
	fmt.Fprintf(stdout, "relaying to an in-process Kafka broker at %s, topic %s (%d partitions, keyed by host_id)\n",
		kc.ListenAddrs()[0], demoKafkaTopic, demoKafkaPartitions)
	return &demoKafka{cluster: kc, sink: s}, nil
}

// report prints how many records the topic holds.
func (d *demoKafka) report(ctx context.Context, stdout io.Writer) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(d.cluster.ListenAddrs()...))
	if err != nil {
		return err
	}
	defer cl.Close()
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = demoKafkaTopic
	for p := range demoKafkaPartitions {
		rp := kmsg.NewListOffsetsRequestTopicPartition()
		rp.Partition = int32(p)
		rp.Timestamp = -1 // the high watermark
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("demo: kafka: list offsets: %w", err)
	}
	var n int64
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			n += p.Offset
		}
	}
	fmt.Fprintf(stdout, "kafka: %d records in topic %s\n", n, demoKafkaTopic)
	return nil
}

// close stops the relay and the broker.
func (d *demoKafka) close() {
	d.sink.Close()
	d.cluster.Close()
}
