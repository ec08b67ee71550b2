package kafka_test

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents/kafka"
)

// TestFetchEmptyRecordSet: a partition a Fetch finds nothing in (caught
// up, or refused) is answered with an empty record set, never a null one,
// which librdkafka (kcat) cannot parse.
func TestFetchEmptyRecordSet(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, "", kafka.Options{})
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID, req.MaxWaitMillis, req.MaxBytes = -1, 0, 1<<20
	ft := kmsg.NewFetchRequestTopic()
	ft.Topic = "events"
	for p := range int32(3) { // partition 2 does not exist
		fp := kmsg.NewFetchRequestTopicPartition()
		fp.Partition, fp.FetchOffset, fp.PartitionMaxBytes, fp.LogStartOffset = p, 1, 1<<20, -1
		ft.Partitions = append(ft.Partitions, fp)
	}
	req.Topics = append(req.Topics, ft)
	resp, err := req.RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, rt := range resp.Topics {
		for _, rp := range rt.Partitions {
			if rp.RecordBatches == nil {
				t.Errorf("partition %d (error %d): a null record set, want an empty one", rp.Partition, rp.ErrorCode)
			}
		}
	}
	if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 3 {
		t.Fatalf("response %+v", resp)
	}
}
