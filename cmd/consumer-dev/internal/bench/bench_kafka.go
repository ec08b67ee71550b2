package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/sink/kafkasink"
)

// benchKafka measures the Kafka relay: a backlog of N events (200,000; 30,000
// quick) over 8 partitions relayed by one in-process consumer into an
// in-process Kafka cluster (kfake, one broker, a 12-partition topic), for
// batch sizes 100 and 1000; and, in the same run, a bare franz-go producer
// (idempotent, acks=all, as the relay) writing the same records from
// memory, with nothing else to do. The ratio relay / bare producer is what
// the relay's consumer work (claim, fetch, commit per batch, waiting for
// every batch's acknowledgements before the next) leaves of the producer's
// rate on this machine. A second relay sends each event to the topic of
// its user ("bench.{user_id}", 5 topics), so that a host's events switch
// topic at random: the relay then holds a host's record back until the
// host's earlier records to other topics are acknowledged, and the ratio
// to the first relay is what keeping a host's order across topics costs.
func benchKafka(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	n := benchPick(e, int64(200_000), int64(30_000))
	topics := []string{"bench"}
	for _, u := range benchUserNames {
		topics = append(topics, "bench."+u)
	}
	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(12, topics...))
	if err != nil {
		return nil, err
	}
	defer kc.Close()
	bl, err := benchBacklog(ctx, e, 8, n)
	if err != nil {
		return nil, err
	}
	defer bl.db.close()
	relay, err := kafkasink.New(kafkasink.Options{Brokers: kc.ListenAddrs(), Topic: "bench"})
	if err != nil {
		return nil, err
	}
	defer relay.Close()
	perUser, err := kafkasink.New(kafkasink.Options{Brokers: kc.ListenAddrs(), Topic: "bench.{user_id}"})
	if err != nil {
		return nil, err
	}
	defer perUser.Close()
	recs, err := benchKafkaRecords(ctx, bl, relay)
	if err != nil {
		return nil, err
	}

	batchSizes := []int{100, 1000}
	rates := make([][]float64, len(batchSizes))
	users := make([][]float64, len(batchSizes))
	noop := make([][]float64, len(batchSizes))
	var bare []float64
	for rep := range e.reps {
		r, err := benchBareProducer(ctx, kc.ListenAddrs(), recs)
		if err != nil {
			return nil, err
		}
		bare = append(bare, r)
		e.logf("kafka: bare franz-go producer, %d records, rep %d: %.0f records/s", len(recs), rep+1, r)
		for i, b := range batchSizes {
			hs := &pgevents.Handlers{}
			hs.HandleAll(relay)
			r, err := benchKafkaDrain(ctx, bl, fmt.Sprintf("kafka-b%d-r%d", b, rep), b, hs)
			if err != nil {
				return nil, err
			}
			rates[i] = append(rates[i], r)
			e.logf("kafka: relay, batchSize %d, rep %d: %.0f events/s", b, rep+1, r)
			hs = &pgevents.Handlers{}
			hs.HandleAll(perUser)
			if r, err = benchKafkaDrain(ctx, bl, fmt.Sprintf("users-b%d-r%d", b, rep), b, hs); err != nil {
				return nil, err
			}
			users[i] = append(users[i], r)
			e.logf("kafka: relay to a topic per user, batchSize %d, rep %d: %.0f events/s", b, rep+1, r)
			if r, err = benchKafkaDrain(ctx, bl, fmt.Sprintf("noop-b%d-r%d", b, rep), b, benchNoopHandlers()); err != nil {
				return nil, err
			}
			noop[i] = append(noop[i], r)
			e.logf("kafka: no-op handler, batchSize %d, rep %d: %.0f events/s", b, rep+1, r)
		}
	}
	out := []benchResult{newBenchResult("kafka", fmt.Sprintf("bare franz-go producer, %d records from memory", len(recs)), "records/s", bare).
		noted("one client, idempotent, acks=all, everything produced then flushed; kfake, 1 broker, 12 partitions")}
	for i, b := range batchSizes {
		ratio := make([]float64, len(rates[i]))
		userRatio := make([]float64, len(rates[i]))
		for k := range ratio {
			ratio[k] = rates[i][k] / bare[k]
			userRatio[k] = users[i][k] / rates[i][k]
		}
		out = append(out,
			newBenchResult("kafka", fmt.Sprintf("relay %d events, 8 partitions, batchSize %d", n, b), "events/s", rates[i]).
				noted("one consumer process; each batch's records produced together, its offset committed after all are acknowledged"),
			newBenchResult("kafka", fmt.Sprintf("relay / bare producer, batchSize %d", b), "ratio", ratio).
				noted("same records, same run"),
			newBenchResult("kafka", fmt.Sprintf("relay to a topic per user (5), batchSize %d", b), "events/s", users[i]).
				noted("a host's events switch topic at random; a host's record waits for its earlier records to other topics"),
			newBenchResult("kafka", fmt.Sprintf("topic per user / one topic, batchSize %d", b), "ratio", userRatio).
				noted("what keeping a host's order across topics costs; same run"),
			newBenchResult("kafka", fmt.Sprintf("no-op handler, same backlog, batchSize %d", b), "events/s", noop[i]).
				noted("the consumer alone: what the relay's rate is bounded by on the PostgreSQL side"))
	}
	bl.db.close()
	gw, err := benchGateway(ctx, e, kc)
	return append(out, gw...), err
}

// benchKafkaDrain runs a new group over the whole backlog with handlers hs
// and returns the events handled per second.
func benchKafkaDrain(ctx context.Context, bl *benchBacklogDB, group string, batch int, hs *pgevents.Handlers) (float64, error) {
	c, err := startBenchConsumer(ctx, bl.pool, pgevents.Config{GroupID: group, TotalPartitions: bl.partitions, BatchSize: batch, Handlers: hs})
	if err != nil {
		return 0, err
	}
	began := time.Now()
	err = c.waitHandled(ctx, bl.events, 5*time.Minute)
	d := time.Since(began)
	st := c.Stats()
	if serr := c.stop(); err == nil {
		err = serr
	}
	if err != nil {
		return 0, err
	}
	if st.Retries > 0 || st.DeadLettered > 0 {
		return 0, fmt.Errorf("kafka: group %s: %d retries, %d dead letters", group, st.Retries, st.DeadLettered)
	}
	return float64(bl.events) / d.Seconds(), nil
}

// benchKafkaRecords reads the backlog's events and builds the records the
// relay produces for them.
func benchKafkaRecords(ctx context.Context, bl *benchBacklogDB, relay *kafkasink.Sink) ([]*kgo.Record, error) {
	rows, err := bl.pool.Query(ctx, `SELECT c_offset, topic_id, partition_id, event_id::text, host_id, user_id,
		transaction_id, event_type, payload, metadata, created_at FROM outbox_message_t WHERE topic_id = $1 ORDER BY c_offset`, benchTopic)
	if err != nil {
		return nil, err
	}
	var recs []*kgo.Record
	var ev pgevents.Event
	_, err = pgx.ForEachRow(rows, []any{&ev.Offset, &ev.TopicID, &ev.PartitionID, &ev.EventID, &ev.HostID, &ev.UserID,
		&ev.TransactionID, &ev.EventType, &ev.Payload, &ev.Metadata, &ev.CreatedAt}, func() error {
		r, err := relay.Record(&ev)
		if err != nil {
			return err
		}
		recs = append(recs, r)
		return nil
	})
	return recs, err
}

// benchBareProducer produces copies of recs with one franz-go client and
// returns the records acknowledged per second.
func benchBareProducer(ctx context.Context, brokers []string, recs []*kgo.Record) (float64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	if err := cl.Ping(ctx); err != nil {
		return 0, err
	}
	copies := make([]*kgo.Record, len(recs))
	for i, r := range recs {
		copies[i] = &kgo.Record{Topic: r.Topic, Key: r.Key, Value: r.Value, Headers: r.Headers}
	}
	var (
		mu    sync.Mutex
		first error
	)
	began := time.Now()
	for _, r := range copies {
		cl.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				mu.Lock()
				first = cmpErr(first, err)
				mu.Unlock()
			}
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return 0, err
	}
	d := time.Since(began)
	mu.Lock()
	defer mu.Unlock()
	if first != nil {
		return 0, fmt.Errorf("bare producer: %w", first)
	}
	return float64(len(copies)) / d.Seconds(), nil
}

// cmpErr returns err, or other when err is nil.
func cmpErr(err, other error) error {
	if err != nil {
		return err
	}
	return other
}
