package kafka_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/kafka"
	"github.com/pgevents/pgevents/schema"
)

// BenchmarkFetch reads a topic of 20,000 events of 1 KiB over 16
// partitions through the endpoint with one kgo client, from the start to
// the end, per iteration; it reports events/s. `consumer-dev bench --only
// kafka` measures the same with a consumer group, beside the drain and the
// relay.
func BenchmarkFetch(b *testing.B) {
	e := newEnv(b, 16, schema.ScopePartition, kafka.Options{})
	const n = 20000
	pad := strings.Repeat("x", 1000)
	for i := 0; i < n; i += 100 {
		var evs []pgevents.Event
		for j := range 100 {
			evs = append(evs, pgevents.Event{TopicID: 1, HostID: fmt.Sprintf("host-%d", (i+j)%1000), EventType: "bench",
				Payload: []byte(fmt.Sprintf(`{"i": %d, "pad": "%s"}`, i+j, pad))})
		}
		tx, err := e.pool.Begin(e.ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := pgevents.Append(e.ctx, tx, evs...); err != nil {
			b.Fatal(err)
		}
		if err := tx.Commit(e.ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	began := time.Now()
	for range b.N {
		cl, err := kgo.NewClient(kgo.SeedBrokers(e.addr), kgo.ConsumeTopics("events"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			b.Fatal(err)
		}
		got := 0
		ctx, cancel := context.WithTimeout(e.ctx, time.Minute)
		for got < n && ctx.Err() == nil {
			got += cl.PollFetches(ctx).NumRecords()
		}
		cancel()
		cl.Close()
		if got < n {
			b.Fatalf("read %d of %d events", got, n)
		}
	}
	b.ReportMetric(float64(n*b.N)/time.Since(began).Seconds(), "events/s")
}
