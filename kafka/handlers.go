package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/schema"
)

const apiVersionsKey = 18

// versions are the API keys the endpoint serves and their version ranges:
// versions whose fields it fills (topics by name, not by id; the classic
// group protocol). A client negotiates the highest version both know.
var versions = map[int16][2]int16{
	0:  {3, 9},  // Produce: record batches v2 from v3
	1:  {4, 12}, // Fetch: topics by name up to v12
	2:  {1, 7},  // ListOffsets
	3:  {0, 12}, // Metadata
	8:  {2, 8},  // OffsetCommit
	9:  {1, 7},  // OffsetFetch: one group per request up to v7
	10: {0, 3},  // FindCoordinator: one key per request up to v3
	11: {0, 7},  // JoinGroup
	12: {0, 4},  // Heartbeat
	13: {0, 4},  // LeaveGroup
	14: {0, 5},  // SyncGroup
	15: {0, 5},  // DescribeGroups
	16: {0, 4},  // ListGroups
	17: {0, 1},  // SaslHandshake
	18: {0, 3},  // ApiVersions
	22: {0, 4},  // InitProducerId
	36: {0, 2},  // SaslAuthenticate
}

func supported(key int16) (lo, hi int16, ok bool) {
	v, ok := versions[key]
	return v[0], v[1], ok
}

// unsupportedAPIVersions stands for an ApiVersions request of a version
// above ours: it is answered in version 0 with UNSUPPORTED_VERSION and our
// versions, as Kafka does.
type unsupportedAPIVersions struct {
	kmsg.ApiVersionsRequest
	version int16
}

// handle answers one request. A nil response with a nil error sends
// nothing (Produce with acks 0); an error closes the connection.
func (cn *conn) handle(ctx context.Context, req kmsg.Request) (kmsg.Response, error) {
	s := cn.s
	if !cn.authed {
		switch req.(type) {
		case *kmsg.ApiVersionsRequest, *unsupportedAPIVersions, *kmsg.SASLHandshakeRequest, *kmsg.SASLAuthenticateRequest:
		default:
			return nil, fmt.Errorf("%w: request %d before SASL authentication", errClose, req.Key())
		}
	}
	switch r := req.(type) {
	case *unsupportedAPIVersions:
		resp := apiVersions(kmsg.NewPtrApiVersionsResponse())
		resp.SetVersion(0)
		resp.ErrorCode = kerr.UnsupportedVersion.Code
		return resp, nil
	case *kmsg.ApiVersionsRequest:
		resp := apiVersions(r.ResponseKind().(*kmsg.ApiVersionsResponse))
		return resp, nil
	case *kmsg.SASLHandshakeRequest:
		return cn.saslHandshake(r), nil
	case *kmsg.SASLAuthenticateRequest:
		return cn.saslAuthenticate(r)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.RequestTimeout+s.opts.MaxWait)
	defer cancel()
	switch r := req.(type) {
	case *kmsg.MetadataRequest:
		return s.metadata(ctx, r)
	case *kmsg.ListOffsetsRequest:
		return s.listOffsets(ctx, r)
	case *kmsg.FetchRequest:
		return s.fetch(ctx, r)
	case *kmsg.ProduceRequest:
		return s.produce(ctx, cn, r)
	case *kmsg.InitProducerIDRequest:
		return s.initProducerID(r), nil
	case *kmsg.FindCoordinatorRequest:
		return s.findCoordinator(ctx, r), nil
	}
	// A group's requests go to its coordinator; another gateway answers
	// NOT_COORDINATOR, and the client asks FindCoordinator again.
	if g, ok := groupOf(req); ok && !s.leases.owns(ctx, g) {
		return notCoordinator(req), nil
	}
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		return s.groups.join(ctx, cn, r)
	case *kmsg.SyncGroupRequest:
		return s.groups.sync(ctx, r)
	case *kmsg.HeartbeatRequest:
		return s.groups.heartbeat(r), nil
	case *kmsg.LeaveGroupRequest:
		return s.groups.leave(r), nil
	case *kmsg.OffsetCommitRequest:
		return s.groups.commit(ctx, cn, r)
	case *kmsg.OffsetFetchRequest:
		return s.groups.fetchOffsets(ctx, r)
	case *kmsg.DescribeGroupsRequest:
		return s.groups.describe(ctx, r), nil
	case *kmsg.ListGroupsRequest:
		return s.groups.list(r), nil
	}
	return nil, fmt.Errorf("%w: api key %d has no handler", errClose, req.Key())
}

func apiVersions(resp *kmsg.ApiVersionsResponse) *kmsg.ApiVersionsResponse {
	keys := make([]int16, 0, len(versions))
	for k := range versions {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		v := versions[k]
		resp.ApiKeys = append(resp.ApiKeys, kmsg.ApiVersionsResponseApiKey{ApiKey: k, MinVersion: v[0], MaxVersion: v[1]})
	}
	return resp
}

// topic is a pgevents topic as the endpoint exposes it.
type topic struct {
	name string
	id   int

	mu sync.Mutex
	n  int       // partition count
	at time.Time // when n was read; zero: never
}

// partitionsFresh is how long a topic's partition count, once read, is
// taken as it is: a repartition shows within that time.
const partitionsFresh = time.Second

// partitions returns the topic's partition count as the database recorded
// it at most partitionsFresh ago.
func (s *Server) partitions(ctx context.Context, t *topic) (int, error) {
	t.mu.Lock()
	n, at := t.n, t.at
	t.mu.Unlock()
	if !at.IsZero() && time.Since(at) < partitionsFresh {
		return n, nil
	}
	if err := s.pool.QueryRow(ctx, schema.SQL(ctx, partitionsSQL), t.id).Scan(&n); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			return 0, nil
		}
		return 0, fmt.Errorf("kafka: partitions of topic %d: %w", t.id, err)
	}
	t.mu.Lock()
	t.n, t.at = n, time.Now()
	t.mu.Unlock()
	return n, nil
}

func (s *Server) metadata(ctx context.Context, r *kmsg.MetadataRequest) (kmsg.Response, error) {
	resp := r.ResponseKind().(*kmsg.MetadataResponse)
	for _, n := range s.leases.gateways(ctx) {
		resp.Brokers = append(resp.Brokers, kmsg.MetadataResponseBroker{NodeID: n.id, Host: n.host, Port: n.port})
	}
	cluster := "pgevents"
	resp.ClusterID = &cluster
	resp.ControllerID = s.opts.NodeID
	var names []string
	if r.Topics == nil || r.Version == 0 && len(r.Topics) == 0 { // every topic
		for name := range s.topics {
			names = append(names, name)
		}
		slices.Sort(names)
	} else {
		for _, t := range r.Topics {
			if t.Topic != nil {
				names = append(names, *t.Topic)
			}
		}
	}
	for _, name := range names {
		mt := kmsg.NewMetadataResponseTopic()
		mt.Topic = kmsg.StringPtr(name)
		t := s.topics[name]
		if t == nil {
			mt.ErrorCode = kerr.UnknownTopicOrPartition.Code
			resp.Topics = append(resp.Topics, mt)
			continue
		}
		n, err := s.partitions(ctx, t)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			mt.ErrorCode = kerr.UnknownTopicOrPartition.Code
		}
		for p := range n {
			mp := kmsg.NewMetadataResponseTopicPartition()
			mp.Partition = int32(p)
			mp.Leader = s.opts.NodeID
			mp.Replicas = []int32{s.opts.NodeID}
			mp.ISR = []int32{s.opts.NodeID}
			mt.Partitions = append(mt.Partitions, mp)
		}
		resp.Topics = append(resp.Topics, mt)
	}
	return resp, nil
}

// bounds are a partition's log start offset and high watermark.
type bounds struct{ start, hw int64 }

// topicBounds returns topic t's partition count and the bounds of its
// partitions ps (nothing for an unknown topic, t nil).
func (s *Server) topicBounds(ctx context.Context, t *topic, ps []int32) (int, map[int32]bounds, error) {
	if t == nil {
		return 0, nil, nil
	}
	n, err := s.partitions(ctx, t)
	if err != nil {
		return 0, nil, err
	}
	bs, err := s.readBounds(ctx, t, ps)
	return n, bs, err
}

// readBounds reads the bounds of topic t's partitions ps: one statement
// (boundsSQL), and a second one for the partitions without a tail row
// (logEndSQL), which an empty partition is.
func (s *Server) readBounds(ctx context.Context, t *topic, ps []int32) (map[int32]bounds, error) {
	rows, err := s.pool.Query(ctx, schema.SQL(ctx, boundsSQL), t.id, ps)
	if err != nil {
		return nil, fmt.Errorf("kafka: bounds of topic %d: %w", t.id, err)
	}
	out := make(map[int32]bounds, len(ps))
	var (
		p      int32
		start  int64
		tail   *int64
		noTail []int32
	)
	if _, err := pgx.ForEachRow(rows, []any{&p, &start, &tail}, func() error {
		if tail == nil {
			noTail = append(noTail, p)
		}
		out[p] = boundsOf(start, tail)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("kafka: bounds of topic %d: %w", t.id, err)
	}
	if len(noTail) == 0 {
		return out, nil
	}
	rows, err = s.pool.Query(ctx, schema.SQL(ctx, logEndSQL), t.id, noTail)
	if err != nil {
		return nil, fmt.Errorf("kafka: bounds of topic %d: %w", t.id, err)
	}
	if _, err := pgx.ForEachRow(rows, []any{&p, &tail}, func() error {
		out[p] = boundsOf(out[p].start, tail)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("kafka: bounds of topic %d: %w", t.id, err)
	}
	return out, nil
}

// boundsOf is a partition's bounds from its log start and its tail (nil:
// none): the high watermark is the offset after the tail, and never below
// the log start, nor the log start above it.
func boundsOf(start int64, tail *int64) bounds {
	hw := start
	if tail != nil {
		hw = max(*tail+1, start)
	}
	return bounds{start: min(start, hw), hw: hw}
}

func (s *Server) listOffsets(ctx context.Context, r *kmsg.ListOffsetsRequest) (kmsg.Response, error) {
	resp := r.ResponseKind().(*kmsg.ListOffsetsResponse)
	for _, rt := range r.Topics {
		ot := kmsg.NewListOffsetsResponseTopic()
		ot.Topic = rt.Topic
		t := s.topics[rt.Topic]
		ps := make([]int32, len(rt.Partitions))
		for i, rp := range rt.Partitions {
			ps[i] = rp.Partition
		}
		n, bs, err := s.topicBounds(ctx, t, ps)
		if err != nil {
			return nil, err
		}
		for _, rp := range rt.Partitions {
			op := kmsg.NewListOffsetsResponseTopicPartition()
			op.Partition = rp.Partition
			op.Timestamp = -1
			b, ok := bs[rp.Partition]
			switch {
			case t == nil || rp.Partition < 0 || int(rp.Partition) >= n || !ok:
				op.ErrorCode = kerr.UnknownTopicOrPartition.Code
			case rp.Timestamp == -1: // latest
				op.Offset = b.hw
			case rp.Timestamp == -2: // earliest
				op.Offset = b.start
			case rp.Timestamp == -3: // the max timestamp: not kept
				op.ErrorCode = kerr.UnsupportedVersion.Code
			default:
				var off *int64
				if err := s.pool.QueryRow(ctx, schema.SQL(ctx, byTimeSQL), t.id, rp.Partition, time.UnixMilli(rp.Timestamp)).Scan(&off); err != nil && !errors.Is(err, pgx.ErrNoRows) {
					return nil, fmt.Errorf("kafka: offset by time: %w", err)
				}
				if off != nil {
					op.Offset, op.Timestamp = *off, rp.Timestamp
				} else {
					op.Offset = -1
				}
			}
			if r.Version == 0 {
				op.OldStyleOffsets = []int64{op.Offset}
			}
			ot.Partitions = append(ot.Partitions, op)
		}
		resp.Topics = append(resp.Topics, ot)
	}
	return resp, nil
}

// fetchRows is how many events a fetch reads per statement, and
// fetchParallel how many partitions of a fetch are read at once.
const (
	fetchRows     = 1000
	fetchParallel = 4
)

// fetch answers a Fetch: each partition's events from the offset asked,
// up to the request's byte limits; when it has less than MinBytes, it
// waits until an event is appended to a partition it asked for (the
// wake-ups of waiters) or MaxWaitMs (at most Options.MaxWait) has passed.
func (s *Server) fetch(ctx context.Context, r *kmsg.FetchRequest) (kmsg.Response, error) {
	wait := min(time.Duration(r.MaxWaitMillis)*time.Millisecond, s.opts.MaxWait)
	deadline := time.Now().Add(wait)
	for {
		resp, size, watch, err := s.fetchOnce(ctx, r)
		if err != nil {
			return nil, err
		}
		if size >= int(max(r.MinBytes, 1)) || len(watch) == 0 || !time.Now().Before(deadline) {
			return resp, nil
		}
		if !s.waits.wait(ctx, watch, deadline) {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return resp, nil // deadline
		}
	}
}

// fetchOnce reads what a Fetch asks. watch lists the partitions it may
// wait for (no error, caught up), with their high watermarks.
func (s *Server) fetchOnce(ctx context.Context, r *kmsg.FetchRequest) (*kmsg.FetchResponse, int, []watchPoint, error) {
	resp := r.ResponseKind().(*kmsg.FetchResponse)
	budget := int(r.MaxBytes)
	if r.Version < 3 || budget <= 0 {
		budget = 1 << 30
	}
	// The reads to make, each with its share of the request's byte budget:
	// a partition may take its PartitionMaxBytes while the budget lasts
	// (the first one whatever its size, as Kafka does).
	type read struct {
		fp          *kmsg.FetchResponseTopicPartition
		t           *topic
		from, hw    int64
		limit, size int
	}
	var (
		reads []*read
		watch []watchPoint
		first = true
	)
	for _, rt := range r.Topics {
		ft := kmsg.NewFetchResponseTopic()
		ft.Topic = rt.Topic
		t := s.topics[rt.Topic]
		ps := make([]int32, len(rt.Partitions))
		for i, rp := range rt.Partitions {
			ps[i] = rp.Partition
		}
		n, bs, err := s.topicBounds(ctx, t, ps)
		if err != nil {
			return nil, 0, nil, err
		}
		ft.Partitions = make([]kmsg.FetchResponseTopicPartition, len(rt.Partitions))
		for i, rp := range rt.Partitions {
			fp := &ft.Partitions[i]
			fp.Default()
			fp.Partition = rp.Partition
			fp.HighWatermark, fp.LastStableOffset, fp.LogStartOffset = -1, -1, -1
			// Empty, not null, as a Kafka broker answers: librdkafka refuses
			// a partition whose records are null, and so never sees the end
			// of a caught-up partition.
			fp.RecordBatches = []byte{}
			b, ok := bs[rp.Partition]
			switch {
			case t == nil || rp.Partition < 0 || int(rp.Partition) >= n || !ok:
				fp.ErrorCode = kerr.UnknownTopicOrPartition.Code
			case rp.FetchOffset < b.start || rp.FetchOffset > b.hw:
				fp.ErrorCode = kerr.OffsetOutOfRange.Code
				fp.HighWatermark, fp.LastStableOffset, fp.LogStartOffset = b.hw, b.hw, b.start
			default:
				fp.HighWatermark, fp.LastStableOffset, fp.LogStartOffset = b.hw, b.hw, b.start
				if rp.FetchOffset == b.hw {
					watch = append(watch, watchPoint{topic: t.id, partition: rp.Partition, hw: b.hw})
					break
				}
				limit := min(int(rp.PartitionMaxBytes), budget)
				if first {
					limit = max(limit, 1)
				}
				if limit <= 0 {
					break
				}
				first = false
				budget -= limit
				reads = append(reads, &read{fp: fp, t: t, from: rp.FetchOffset, hw: b.hw, limit: limit})
			}
		}
		resp.Topics = append(resp.Topics, ft)
	}
	// The partitions are read concurrently, on fetchParallel connections
	// at most: the server and the encoding share the machine's cores.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(fetchParallel)
	for _, rd := range reads {
		g.Go(func() error {
			recs, err := s.readRecords(gctx, rd.t, rd.fp.Partition, rd.from, rd.hw, rd.limit)
			if err != nil {
				return err
			}
			if recs != nil {
				rd.fp.RecordBatches, rd.size = recs, len(recs)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, 0, nil, err
	}
	size := 0
	for _, rd := range reads {
		size += rd.size
		if rd.size == 0 {
			// Nothing between the offset asked and the high watermark (a
			// gap retention left at the end of the partition): caught up,
			// as at the high watermark.
			watch = append(watch, watchPoint{topic: rd.t.id, partition: rd.fp.Partition, hw: rd.hw})
		}
	}
	return resp, size, watch, nil
}

// readRecords reads partition p's events from offset from, below hw,
// as record batches of at most fetchRows events each, until they hold
// limit bytes or more (at least one batch). The buffer grows by what the
// rows read need (bytes, an upper bound of their records' size), not by
// the limit: a client's limit is a megabyte a partition, and a fetch woken
// by one event allocated and cleared that megabyte (a fifth of the
// endpoint's CPU at 1,000 events/s, most of it in memclr and the GC).
func (s *Server) readRecords(ctx context.Context, t *topic, p int32, from, hw int64, limit int) ([]byte, error) {
	var out []byte
	evs := make([]event, 0, 64)
	for from < hw && len(out) < limit {
		evs = evs[:0]
		rows, err := s.pool.Query(ctx, schema.SQL(ctx, fetchSQL), t.id, p, from, fetchRows)
		if err != nil {
			return nil, fmt.Errorf("kafka: fetch topic %d partition %d: %w", t.id, p, err)
		}
		var ev event
		bytes := 0
		if _, err := pgx.ForEachRow(rows, []any{&ev.offset, &ev.eventID, &ev.host, &ev.user, &ev.txid, &ev.eventType, &ev.payload, &ev.metadata, &ev.createdAt},
			func() error {
				if len(evs) > 0 && len(out)+bytes >= limit {
					return nil
				}
				evs = append(evs, ev)
				bytes += 64 + len(ev.host) + len(ev.eventID) + len(ev.eventType) + len(ev.user) + len(ev.payload) + len(ev.metadata)
				return nil
			}); err != nil {
			return nil, fmt.Errorf("kafka: fetch topic %d partition %d: %w", t.id, p, err)
		}
		if len(evs) == 0 {
			break
		}
		out = appendBatch(slices.Grow(out, batchHeaderSize+bytes), evs)
		from = evs[len(evs)-1].offset + 1
		if len(evs) < fetchRows {
			break
		}
	}
	return out, nil
}

// produce appends a Produce request's records in one transaction: a
// record's key is the event's host_id (a record without one is refused
// with INVALID_RECORD), its value the payload (JSON; anything else is
// refused), the header event_type its type (default "kafka"), user_id its
// user; the other headers go into the metadata. Keys and headers must be
// UTF-8 text without NUL, as the columns they go to are (toEvent). A batch
// holding a record that cannot be appended is refused whole, with
// INVALID_RECORD, and the request's other batches are appended: what
// toEvent refuses, and what the database refuses (appendAll). The
// partition an event lands in is pgevents' (hashtext(host_id) % N),
// whatever partition the
// client chose: the answer gives the first event's offset when every
// record landed in the partition asked, else -1. An idempotent producer's
// records carry idempotency keys of its producer id, the partition asked
// and their sequence numbers, so a batch sent again appends nothing twice.
func (s *Server) produce(ctx context.Context, cn *conn, r *kmsg.ProduceRequest) (kmsg.Response, error) {
	resp := r.ResponseKind().(*kmsg.ProduceResponse)
	type slot struct {
		ti, pi int
		first  int // index in evs
		n      int
	}
	var (
		evs   []pgevents.Event
		slots []slot
	)
	for ti, rt := range r.Topics {
		pt := kmsg.NewProduceResponseTopic()
		pt.Topic = rt.Topic
		t := s.topics[rt.Topic]
		n := 0
		if t != nil {
			var err error
			if n, err = s.partitions(ctx, t); err != nil {
				return nil, err
			}
		}
		for pi, rp := range rt.Partitions {
			pp := kmsg.NewProduceResponseTopicPartition()
			pp.Partition = rp.Partition
			pp.BaseOffset = -1
			pp.LogAppendTime = -1
			switch {
			case t == nil || rp.Partition < 0 || int(rp.Partition) >= n:
				pp.ErrorCode = kerr.UnknownTopicOrPartition.Code
			case s.opts.ReadOnly:
				pp.ErrorCode = kerr.TopicAuthorizationFailed.Code
				pp.ErrorMessage = kmsg.StringPtr("this endpoint is read-only")
				cn.refuse("produce", pp.ErrorCode, *pp.ErrorMessage, "", rt.Topic, rp.Partition)
			default:
				batch, err := parseProduced(rp.Records, int(s.opts.MaxRequestBytes))
				if err != nil {
					pp.ErrorCode = kerr.CorruptMessage.Code
					pp.ErrorMessage = kmsg.StringPtr(err.Error())
					cn.refuse("produce", pp.ErrorCode, err.Error(), "", rt.Topic, rp.Partition)
					break
				}
				first := len(evs)
				bad := ""
				for i, rec := range batch.records {
					ev, why := toEvent(t, rec)
					if why != "" {
						bad = fmt.Sprintf("record %d: %s", i, why)
						pp.ErrorRecords = append(pp.ErrorRecords, kmsg.ProduceResponseTopicPartitionErrorRecord{RelativeOffset: int32(i), ErrorMessage: kmsg.StringPtr(why)})
						continue
					}
					if rec.seq >= 0 {
						ev.IdempotencyKey = fmt.Sprintf("kafka/%d/%d/%d", rec.producerID, rp.Partition, rec.seq)
					}
					evs = append(evs, ev)
				}
				if bad != "" {
					// The batch is refused whole, as Kafka refuses a batch
					// with an invalid record.
					evs = evs[:first]
					pp.ErrorCode = kerr.InvalidRecord.Code
					pp.ErrorMessage = kmsg.StringPtr(bad)
					cn.refuse("produce", pp.ErrorCode, bad, "", rt.Topic, rp.Partition)
					break
				}
				slots = append(slots, slot{ti: ti, pi: pi, first: first, n: len(evs) - first})
			}
			pt.Partitions = append(pt.Partitions, pp)
		}
		resp.Topics = append(resp.Topics, pt)
	}
	if len(evs) > 0 {
		spans := make([][2]int, len(slots))
		for i, sl := range slots {
			spans[i] = [2]int{sl.first, sl.first + sl.n}
		}
		res, refused, err := s.appendAll(ctx, evs, spans)
		// A failure of the database that may pass (an outage, a
		// timeout, a conflict) is KAFKA_STORAGE_ERROR, which clients
		// retry; any other would fail the same way again, and is
		// answered UNKNOWN_SERVER_ERROR, which they do not.
		failed := kerr.KafkaStorageError
		if err != nil && pgevents.Classify(err) != pgevents.ClassTransient {
			failed = kerr.UnknownServerError
		}
		for i, sl := range slots {
			pp := &resp.Topics[sl.ti].Partitions[sl.pi]
			switch why, bad := refused[i]; {
			case err != nil:
				pp.ErrorCode = failed.Code
				pp.ErrorMessage = kmsg.StringPtr(err.Error())
				cn.refuse("produce", pp.ErrorCode, err.Error(), "", r.Topics[sl.ti].Topic, pp.Partition)
			case bad:
				pp.ErrorCode = kerr.InvalidRecord.Code
				pp.ErrorMessage = kmsg.StringPtr(why)
				cn.refuse("produce", pp.ErrorCode, why, "", r.Topics[sl.ti].Topic, pp.Partition)
			default:
				same := true
				for _, rs := range res[sl.first : sl.first+sl.n] {
					same = same && !rs.Sequenced && int32(rs.Partition) == pp.Partition
				}
				if same && sl.n > 0 {
					pp.BaseOffset = res[sl.first].Offset
				}
			}
		}
	}
	if r.Acks == 0 {
		return nil, nil
	}
	return resp, nil
}

// appendAll appends evs in one transaction and commits. spans are the
// [first, end) ranges of evs of the request's partitions. When the
// database refuses an event's data (SQLSTATE class 22, such as a number
// beyond numeric's range in a payload), it appends again, in one
// transaction, each span in a savepoint: refused names the spans it
// refused, with the database's reason, and their events are not appended;
// the others are, in the same order.
func (s *Server) appendAll(ctx context.Context, evs []pgevents.Event, spans [][2]int) ([]pgevents.AppendResult, map[int]string, error) {
	res, err := s.appendTx(ctx, func(tx pgx.Tx) ([]pgevents.AppendResult, error) {
		return pgevents.AppendResults(ctx, tx, evs...)
	})
	if err == nil || !dataError(err) {
		return res, nil, err
	}
	refused := map[int]string{}
	res, err = s.appendTx(ctx, func(tx pgx.Tx) ([]pgevents.AppendResult, error) {
		clear(refused)
		out := make([]pgevents.AppendResult, len(evs))
		for i, sp := range spans {
			sav, err := tx.Begin(ctx) // a savepoint
			if err != nil {
				return nil, err
			}
			r, err := pgevents.AppendResults(ctx, sav, evs[sp[0]:sp[1]]...)
			if err != nil {
				if rerr := sav.Rollback(ctx); rerr != nil || !dataError(err) {
					return nil, errors.Join(err, rerr)
				}
				refused[i] = "the database refused the batch: " + err.Error()
				continue
			}
			if err := sav.Commit(ctx); err != nil {
				return nil, err
			}
			copy(out[sp[0]:], r)
		}
		return out, nil
	})
	return res, refused, err
}

// appendTx runs do in a transaction and commits.
func (s *Server) appendTx(ctx context.Context, do func(pgx.Tx) ([]pgevents.AppendResult, error)) ([]pgevents.AppendResult, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("kafka: produce: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after commit
	res, err := do(tx)
	if err != nil {
		return nil, fmt.Errorf("kafka: produce: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("kafka: produce: %w", err)
	}
	return res, nil
}

// dataError reports whether err is the refusal of an event's data rather
// than a failure of the database: pgevents' own checks, or SQLSTATE class
// 22 (data exception).
func dataError(err error) bool {
	var pe *pgconn.PgError
	return errors.Is(err, pgevents.ErrInvalidEvent) || errors.As(err, &pe) && strings.HasPrefix(pe.Code, "22")
}

// toEvent makes an event of a produced record, or says why it cannot:
// the database stores host_id, event_type and user_id as text, metadata
// and payload as jsonb, which hold neither a NUL character nor bytes that
// are not UTF-8 (a key such as "a\xff" would otherwise be stored altered,
// or fail the whole request's transaction).
func toEvent(t *topic, rec produced) (pgevents.Event, string) {
	if len(rec.key) == 0 {
		return pgevents.Event{}, "a record needs a key: it is the event's host_id, which chooses its partition"
	}
	if !isText(rec.key) {
		return pgevents.Event{}, "the key is not UTF-8 text without NUL: it is the event's host_id, a text"
	}
	ev := pgevents.Event{TopicID: t.id, HostID: string(rec.key), EventType: "kafka"}
	if rec.value != nil {
		if !json.Valid(rec.value) {
			return pgevents.Event{}, "the value is not JSON: a pgevents payload is JSON"
		}
		if !isJSONBText(rec.value) {
			return pgevents.Event{}, "the value is JSON that jsonb cannot hold (bytes that are not UTF-8, \\u0000, or a lone surrogate)"
		}
		ev.Payload = rec.value
	}
	md := map[string]string{}
	for _, h := range rec.headers {
		if !isText([]byte(h.Key)) || !isText(h.Value) {
			return pgevents.Event{}, fmt.Sprintf("header %q: not UTF-8 text without NUL: the headers go into the event's text columns and JSON metadata", h.Key)
		}
		switch h.Key {
		case HeaderEventType:
			if len(h.Value) == 0 {
				return pgevents.Event{}, "the header event_type is empty: an event's type is required"
			}
			ev.EventType = string(h.Value)
		case HeaderUserID:
			ev.UserID = string(h.Value)
		case HeaderEventID, HeaderTransactionID:
			// Assigned by pgevents.
		default:
			md[h.Key] = string(h.Value)
		}
	}
	if len(md) > 0 {
		b, _ := json.Marshal(md)
		ev.Metadata = b
	}
	return ev, ""
}

func (s *Server) initProducerID(r *kmsg.InitProducerIDRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.InitProducerIDResponse)
	if s.opts.ReadOnly {
		resp.ErrorCode = kerr.ClusterAuthorizationFailed.Code
		return resp
	}
	if r.TransactionalID != nil {
		// Transactions are not served: a transactional producer is told so
		// at once.
		resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
		return resp
	}
	resp.ProducerID = newProducerID()
	resp.ProducerEpoch = 0
	return resp
}

// findCoordinator answers with the gateway that coordinates the group:
// this one, when it holds the group's key or takes it now, else the
// holder (see leases).
func (s *Server) findCoordinator(ctx context.Context, r *kmsg.FindCoordinatorRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.FindCoordinatorResponse)
	resp.NodeID = -1
	if r.CoordinatorType != 0 {
		// Transactions are not served: a transactional producer is told so
		// at once, as InitProducerId tells it, and not by a retriable
		// error that would fail the same way for ever.
		resp.ErrorCode = kerr.TransactionalIDAuthorizationFailed.Code
		resp.ErrorMessage = kmsg.StringPtr("transactions are not served: only group coordinators are")
		return resp
	}
	n, _, err := s.leases.coordinator(ctx, r.CoordinatorKey)
	if err != nil {
		resp.ErrorCode = kerr.CoordinatorNotAvailable.Code
		resp.ErrorMessage = kmsg.StringPtr(err.Error())
		return resp
	}
	resp.NodeID, resp.Host, resp.Port = n.id, n.host, n.port
	return resp
}

// notCoordinator answers a group request with NOT_COORDINATOR.
func notCoordinator(req kmsg.Request) kmsg.Response {
	code := kerr.NotCoordinator.Code
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		resp := r.ResponseKind().(*kmsg.JoinGroupResponse)
		resp.ErrorCode, resp.Generation = code, -1
		return resp
	case *kmsg.SyncGroupRequest:
		resp := r.ResponseKind().(*kmsg.SyncGroupResponse)
		resp.ErrorCode = code
		return resp
	case *kmsg.HeartbeatRequest:
		resp := r.ResponseKind().(*kmsg.HeartbeatResponse)
		resp.ErrorCode = code
		return resp
	case *kmsg.LeaveGroupRequest:
		resp := r.ResponseKind().(*kmsg.LeaveGroupResponse)
		resp.ErrorCode = code
		return resp
	case *kmsg.OffsetCommitRequest:
		resp := r.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range r.Topics {
			ct := kmsg.NewOffsetCommitResponseTopic()
			ct.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				cp := kmsg.NewOffsetCommitResponseTopicPartition()
				cp.Partition, cp.ErrorCode = rp.Partition, code
				ct.Partitions = append(ct.Partitions, cp)
			}
			resp.Topics = append(resp.Topics, ct)
		}
		return resp
	case *kmsg.OffsetFetchRequest:
		resp := r.ResponseKind().(*kmsg.OffsetFetchResponse)
		resp.ErrorCode = code
		for _, rt := range r.Topics {
			ft := kmsg.NewOffsetFetchResponseTopic()
			ft.Topic = rt.Topic
			for _, p := range rt.Partitions {
				fp := kmsg.NewOffsetFetchResponseTopicPartition()
				fp.Partition, fp.Offset, fp.ErrorCode = p, -1, code
				ft.Partitions = append(ft.Partitions, fp)
			}
			resp.Topics = append(resp.Topics, ft)
		}
		return resp
	}
	panic(fmt.Sprintf("kafka: notCoordinator of request %d", req.Key()))
}

// groupOf returns the group a request of one group names.
func groupOf(req kmsg.Request) (string, bool) {
	switch r := req.(type) {
	case *kmsg.JoinGroupRequest:
		return r.Group, true
	case *kmsg.SyncGroupRequest:
		return r.Group, true
	case *kmsg.HeartbeatRequest:
		return r.Group, true
	case *kmsg.LeaveGroupRequest:
		return r.Group, true
	case *kmsg.OffsetCommitRequest:
		return r.Group, true
	case *kmsg.OffsetFetchRequest:
		return r.Group, true
	}
	return "", false
}
