package kafkasink

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgevents/pgevents"
)

// flusher holds one attempt at a batch: the records it buffered on the
// partition's client, and those that failed.
//
// # Order across Kafka topics
//
// The producer keeps the order of the records of one Kafka partition, and
// only of those: records to different topics (or partitions) are sent, and
// retried, independently. When the topic template can send a host's
// events to several topics, a host's record therefore waits until the
// host's earlier records to other topics are acknowledged: it goes in a
// later wave. A record is in wave w when its host switched topic w times
// among its records of the attempt so far (since the last complete flush);
// Flush sends wave 0, waits for its acknowledgements, then sends wave 1,
// and so on, and sends no later wave once a record failed. A host's
// records to one topic stay in one wave, so they travel together; hosts
// whose records all go to one topic (always so for a template that uses
// no field but host_id and partition_id) only ever use wave 0, where
// records are produced as Handle adds them, as before.
type flusher struct {
	s       *Sink
	p       *part
	started bool

	buffered  int                  // records added since the last complete flush
	unflushed int                  // records produced on the client since its last Flush
	stopped   *pgevents.EventError // a failure an early flush found

	hosts map[string]hostWave // per host, its last record's topic and wave; nil unless the topic varies within a host
	waves [][]waitingRecord   // the records of waves 1, 2, ... not produced yet

	mu      sync.Mutex
	pending int           // records produced and not yet finished
	idle    chan struct{} // closed when pending drops to 0, if set
	failed  []failedRecord
}

// hostWave is where a host's last record of the attempt went: its topic
// and its wave.
type hostWave struct {
	topic string
	wave  int
}

// waitingRecord is a record of a later wave, produced once the waves
// before it are acknowledged.
type waitingRecord struct {
	offset int64
	id     string
	rec    *kgo.Record
}

// failedRecord is a record whose delivery failed.
type failedRecord struct {
	offset int64
	id     string
	rec    *kgo.Record
	err    error
}

// add buffers ev's record, unless an earlier attempt delivered it.
func (f *flusher) add(ctx context.Context, ev *pgevents.Event) error {
	if !f.started {
		f.started = true
		// Records of an earlier attempt that failed before its flush were
		// never sent: they must not be sent after this attempt's. Abort
		// them (and wait for any still in flight, after a flush cut short).
		// The wait ends before the handler's time budget does, so that an
		// outage is a transient failure, never a handler timeout.
		if f.p.cl.BufferedProduceRecords() > 0 {
			wctx, cancel := context.WithTimeout(ctx, f.s.opts.DeliveryTimeout)
			err := f.p.cl.AbortBufferedRecords(wctx)
			cancel()
			if err != nil {
				return pgevents.Retryable(fmt.Errorf("kafka sink: abort the records of an earlier attempt: %w", err))
			}
		}
	}
	if f.stopped != nil {
		return f.stopped
	}
	if f.p.acked.Has(ev.EventID) {
		return nil
	}
	rec, err := f.s.record(ctx, ev)
	if err != nil {
		return err
	}
	if f.buffered >= flushEvery {
		wctx, cancel := context.WithTimeout(ctx, f.s.opts.DeliveryTimeout)
		err := f.Flush(wctx)
		cancel()
		if err != nil {
			if ee, ok := err.(*pgevents.EventError); ok {
				f.stopped = ee
			}
			return err
		}
	}
	f.buffered++
	if w := f.wave(ev.HostID, rec.Topic); w > 0 {
		for len(f.waves) < w {
			f.waves = append(f.waves, nil)
		}
		f.waves[w-1] = append(f.waves[w-1], waitingRecord{offset: ev.Offset, id: ev.EventID, rec: rec})
		return nil
	}
	f.produce(ev.Offset, ev.EventID, rec)
	return nil
}

// wave returns the wave of a record of host to topic (see flusher), and
// records it as the host's last.
func (f *flusher) wave(host, topic string) int {
	if !f.s.topicPerEvent {
		return 0
	}
	if f.hosts == nil {
		f.hosts = map[string]hostWave{}
	}
	h, ok := f.hosts[host]
	if ok && h.topic != topic {
		h.wave++
	}
	h.topic = topic
	f.hosts[host] = h
	return h.wave
}

// produce hands the record of the event at offset, with id, to the
// partition's client, which sends it at the next Flush.
func (f *flusher) produce(offset int64, id string, rec *kgo.Record) {
	f.unflushed++
	f.mu.Lock()
	f.pending++
	f.mu.Unlock()
	start := time.Now()
	f.p.placing.add(rec)
	// Never cancelled: a record's context that ends fails every record
	// buffered after it in its Kafka partition. Deliveries are bounded by
	// the delivery timeout, the wait for them by Flush's context.
	f.p.cl.Produce(context.Background(), rec, func(r *kgo.Record, err error) {
		f.p.placing.placed(r)
		if err != nil {
			f.p.metrics.Failed(Classify(err))
		} else {
			f.p.acked.Add(id)
			f.p.metrics.Delivered(time.Since(start))
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if err != nil {
			f.failed = append(f.failed, failedRecord{offset: offset, id: id, rec: r, err: err})
		}
		f.pending--
		if f.pending == 0 && f.idle != nil {
			close(f.idle)
			f.idle = nil
		}
	})
}

// Flush sends the buffered records and waits for all of them, wave after
// wave (see flusher), then reports the earliest failure. Once a wave has a
// failure, the later waves are not sent: their records may follow a host's
// record that failed. The failure reported is the earliest among the
// records sent; a record of a later wave with a lower offset was not sent,
// and goes in the attempt the consumer makes next (a retry, or the batch
// without the blamed unit), whose flush precedes any commit.
func (f *flusher) Flush(ctx context.Context) error {
	if f.stopped != nil {
		return f.stopped
	}
	if f.p == nil {
		return pgevents.Retryable(errClosed)
	}
	for {
		if f.unflushed > 0 {
			if err := f.p.flush(ctx); err != nil {
				return f.unfinished(ctx, err)
			}
			f.unflushed = 0
		}
		if err := f.wait(ctx); err != nil {
			return f.unfinished(ctx, err)
		}
		if err := f.resolve(ctx); err != nil {
			return err
		}
		if len(f.waves) == 0 {
			break
		}
		for _, w := range f.waves[0] {
			f.produce(w.offset, w.id, w.rec)
		}
		f.waves = f.waves[1:]
	}
	// Every record added so far is acknowledged: a host's next record may
	// go to any topic at once.
	f.buffered = 0
	f.waves = nil
	clear(f.hosts)
	return nil
}

// unfinished is the error of a flush whose context ended.
func (f *flusher) unfinished(ctx context.Context, err error) error {
	f.mu.Lock()
	n := f.pending
	f.mu.Unlock()
	return pgevents.Retryable(fmt.Errorf("kafka sink: %d records not acknowledged: %w", n, cmpErr(context.Cause(ctx), err)))
}

// wait waits until every record produced has finished.
func (f *flusher) wait(ctx context.Context) error {
	f.mu.Lock()
	if f.pending == 0 {
		f.mu.Unlock()
		return nil
	}
	if f.idle == nil {
		f.idle = make(chan struct{})
	}
	idle := f.idle
	f.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// resolve reports the failure of the earliest record that failed, if any.
//
// A transient or deployment failure is reported as it is: the batch is
// retried. A permanent one (or one of unknown class) may be collateral: a
// broker refuses a whole batch of records for one of them, and the
// producer then fails every record buffered after it in the partition.
// So the failed records are produced again, one at a time, in offset
// order, and the first that fails alone is reported. The failed records of
// a Kafka partition are the last of the attempt's records there, so
// producing them in offset order keeps the partition's order; those that
// go through are delivered, and the rest wait for the next attempt.
func (f *flusher) resolve(ctx context.Context) error {
	f.mu.Lock()
	failed := f.failed
	f.failed = nil
	f.mu.Unlock()
	if len(failed) == 0 {
		return nil
	}
	slices.SortFunc(failed, func(a, b failedRecord) int { return cmp.Compare(a.offset, b.offset) })
	first := &failed[0]
	if class := Classify(first.err); class == pgevents.ClassTransient || class == pgevents.ClassDeployment {
		return f.eventError(first, first.err, class)
	}
	for i := range failed {
		fr := &failed[i]
		rec := &kgo.Record{Topic: fr.rec.Topic, Key: fr.rec.Key, Value: fr.rec.Value, Headers: fr.rec.Headers}
		err := f.produceAlone(ctx, rec)
		if ctx.Err() != nil {
			return pgevents.Retryable(fmt.Errorf("kafka sink: trying the refused records one at a time: %w", context.Cause(ctx)))
		}
		if err != nil {
			return f.eventError(fr, err, Classify(err))
		}
		f.p.acked.Add(fr.id)
	}
	return nil
}

// produceAlone produces rec on its own and waits for its acknowledgement.
func (f *flusher) produceAlone(ctx context.Context, rec *kgo.Record) error {
	done := make(chan error, 1)
	start := time.Now()
	f.p.placing.add(rec)
	f.p.cl.Produce(context.Background(), rec, func(r *kgo.Record, err error) {
		f.p.placing.placed(r)
		done <- err
	})
	if err := f.p.flush(ctx); err != nil {
		return err
	}
	select {
	case err := <-done:
		if err != nil {
			f.p.metrics.Failed(Classify(err))
		} else {
			f.p.metrics.Delivered(time.Since(start))
		}
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// eventError reports the failure of fr's delivery against its event.
func (f *flusher) eventError(fr *failedRecord, err error, class pgevents.Class) *pgevents.EventError {
	return &pgevents.EventError{Offset: fr.offset, Err: &pgevents.ClassifiedError{Class: class,
		Err: fmt.Errorf("kafka sink: produce event %s (offset %d) to topic %s: %w", fr.id, fr.offset, fr.rec.Topic, err)}}
}

// End forgets the events delivered since the partition's last commit when
// the batch committed. Records still in flight after a flush cut short are
// waited for by the next attempt's first record (see add).
func (f *flusher) End(committed bool) {
	if committed && f.p != nil {
		f.p.acked.Clear()
	}
}

// flush sends the records produced on the partition's client, once the
// client has placed every one of them (see placing), and waits for their
// acknowledgements.
func (p *part) flush(ctx context.Context) error {
	if err := p.placing.wait(ctx); err != nil {
		return err
	}
	return p.cl.Flush(ctx)
}

// placing tracks the records produced on a partition's client that the
// producer has not placed in their Kafka partition's buffer yet. It is the
// client's produce hook.
//
// A record whose topic the client knows is placed as it is produced. One
// produced before the client has the topic's metadata waits, and is placed
// when the metadata comes. Were the client flushing then, it could send a
// first batch of a Kafka partition's records while later ones are still
// being placed; when the broker refuses that batch, the producer fails
// every record in the partition's buffer and moves to a new producer epoch,
// and the records placed after that start a new batch, which the broker
// writes: records after a refused one, in Kafka ahead of the refused
// batch's records, which are sent again. A flush therefore waits until
// every record produced is placed or has failed (see part.flush): the
// records it sends are then all in the buffer that a refusal empties.
type placing struct {
	mu       sync.Mutex
	unplaced map[*kgo.Record]struct{}
	done     chan struct{} // closed when unplaced empties, if set
}

// OnProduceRecordPartitioned is called by the client when it places r.
func (p *placing) OnProduceRecordPartitioned(r *kgo.Record, _ int32) { p.placed(r) }

// add notes that r is about to be produced.
func (p *placing) add(r *kgo.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.unplaced == nil {
		p.unplaced = map[*kgo.Record]struct{}{}
	}
	p.unplaced[r] = struct{}{}
}

// placed notes that r is placed, or finished without being placed (it
// failed, or was aborted, before the client knew its topic).
func (p *placing) placed(r *kgo.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.unplaced[r]; !ok {
		return
	}
	delete(p.unplaced, r)
	if len(p.unplaced) == 0 && p.done != nil {
		close(p.done)
		p.done = nil
	}
}

// wait waits until every record produced is placed.
func (p *placing) wait(ctx context.Context) error {
	p.mu.Lock()
	if len(p.unplaced) == 0 {
		p.mu.Unlock()
		return nil
	}
	if p.done == nil {
		p.done = make(chan struct{})
	}
	done := p.done
	p.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
