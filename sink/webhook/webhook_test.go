package webhook_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/sinktest"
	"github.com/pgevents/pgevents/sink/webhook"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// request is a request a test server received.
type request struct {
	key    string // Idempotency-Key
	trace  string // traceparent
	ev     pgevents.Event
	status int // what the server answered
	at     time.Time
}

// server is an endpoint that decodes each request's event, answers with
// answer's status (200 when nil), and remembers every request and the
// most requests it served at once.
type server struct {
	answer func(r *request) (status int, header http.Header, body string)

	mu       sync.Mutex
	reqs     []request
	inflight atomic.Int64
	peak     atomic.Int64
}

func newServer(t *testing.T, answer func(r *request) (int, http.Header, string)) (*server, string) {
	s := &server{answer: answer}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	return s, ts.URL + "/events"
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := s.inflight.Add(1)
	defer s.inflight.Add(-1)
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
	req := request{key: r.Header.Get("Idempotency-Key"), trace: r.Header.Get(pgevents.TraceParentKey), status: 200, at: time.Now()}
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req.ev); err != nil || r.Method != "POST" || r.Header.Get("Content-Type") != "application/json" {
		req.status = 599 // not what the relay sends: fails the checks
	}
	var header http.Header
	var text string
	if s.answer != nil && req.status == 200 {
		req.status, header, text = s.answer(&req)
	}
	s.mu.Lock()
	s.reqs = append(s.reqs, req)
	s.mu.Unlock()
	for k, v := range header {
		w.Header()[k] = v
	}
	w.WriteHeader(req.status)
	_, _ = io.WriteString(w, text)
}

// requests returns the requests received so far.
func (s *server) requests() []request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]request(nil), s.reqs...)
}

// check asserts that the events of the log reached the server, answered
// with a 2xx, with the Idempotency-Key their event_id, in c_offset order per
// host once duplicates are removed, each at most dups times beyond the
// first; events in skip must not have been delivered. It returns the
// number of duplicates.
func check(t *testing.T, reqs []request, log map[string]sinktest.LogEvent, skip map[string]bool) int {
	t.Helper()
	delivered := map[string]bool{}
	last := map[string]int64{}
	dups := 0
	for _, r := range reqs {
		if r.status == 599 {
			t.Fatalf("malformed request: %+v", r)
		}
		if r.key != r.ev.EventID {
			t.Fatalf("Idempotency-Key %q for event %s", r.key, r.ev.EventID)
		}
		e, ok := log[r.key]
		if !ok || e.Offset != r.ev.Offset || e.HostID != r.ev.HostID || e.EventType != r.ev.EventType {
			t.Fatalf("request %+v does not match the log's %+v", r.ev, e)
		}
		if r.status/100 != 2 {
			continue
		}
		if skip[r.key] {
			t.Fatalf("event at offset %d delivered, but it was dead-lettered", e.Offset)
		}
		if delivered[r.key] {
			dups++
			continue
		}
		delivered[r.key] = true
		if prev, ok := last[e.HostID]; ok && prev >= e.Offset {
			t.Fatalf("host %s: event at offset %d delivered after %d", e.HostID, e.Offset, prev)
		}
		last[e.HostID] = e.Offset
	}
	for id, e := range log {
		if !delivered[id] && !skip[id] {
			t.Fatalf("event at offset %d (host %s) never delivered", e.Offset, e.HostID)
		}
	}
	return dups
}

func relay(t *testing.T, opts webhook.Options) *webhook.Sink {
	t.Helper()
	s, err := webhook.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func consume(t *testing.T, pool *pgxpool.Pool, partitions int, h pgevents.Handler) *pgevents.Consumer {
	t.Helper()
	hs := &pgevents.Handlers{}
	hs.HandleAll(h)
	return sinktest.StartConsumer(t, pool, pgevents.Config{TotalPartitions: partitions, BatchSize: 50, Handlers: hs,
		RetryInitial: 10 * time.Millisecond, RetryMax: 2 * time.Second})
}

// appendRandom appends at least n events over hosts hosts in transactions
// of 1 to 10 events.
func appendRandom(t *testing.T, seed uint64, pool *pgxpool.Pool, n, hosts int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 3))
	for total := 0; total < n; {
		evs := make([]pgevents.Event, 1+rng.IntN(10))
		for i := range evs {
			evs[i] = pgevents.Event{HostID: fmt.Sprintf("host-%d", rng.IntN(hosts)), EventType: "t", Payload: []byte(`{}`)}
		}
		sinktest.AppendTx(t, pool, evs...)
		total += len(evs)
	}
}

// TestRelayInOrderPerHost: 1,000 events over 30 hosts reach the endpoint
// once each (nothing failed), in order per host, with their
// Idempotency-Key.
func TestRelayInOrderPerHost(t *testing.T) {
	t.Parallel()
	srv, url := newServer(t, nil)
	pool := pgtest.TopicPool(t, 2)
	consume(t, pool, 2, relay(t, webhook.Options{URL: url}))
	appendRandom(t, 1, pool, 1000, 30)
	sinktest.WaitCaughtUp(t, pool, "g", time.Minute)
	if dups := check(t, srv.requests(), sinktest.Log(t, pool), nil); dups != 0 {
		t.Fatalf("%d duplicates without a failure", dups)
	}
}

// Test503ThenOK: the endpoint answers 503 (Retry-After: 1) for 3 s, then
// 200: nothing is dead-lettered, everything is delivered in order per host.
func Test503ThenOK(t *testing.T) {
	t.Parallel()
	var until atomic.Int64
	srv, url := newServer(t, func(*request) (int, http.Header, string) {
		if time.Now().UnixNano() < until.Load() {
			return 503, http.Header{"Retry-After": {"1"}}, "maintenance"
		}
		return 200, nil, ""
	})
	pool := pgtest.TopicPool(t, 2)
	c := consume(t, pool, 2, relay(t, webhook.Options{URL: url}))
	until.Store(time.Now().Add(3 * time.Second).UnixNano())
	appendRandom(t, 2, pool, 300, 20)
	sinktest.WaitCaughtUp(t, pool, "g", time.Minute)
	if dls := sinktest.DeadLetters(t, pool, "g"); len(dls) != 0 {
		t.Fatalf("%d dead letters: %s", len(dls), dls[0].Error)
	}
	reqs := srv.requests()
	failed := 0
	for _, r := range reqs {
		if r.status == 503 {
			failed++
		}
	}
	if failed == 0 || c.Stats().Retries == 0 {
		t.Fatalf("%d requests answered 503, %d batches retried: the outage was not seen", failed, c.Stats().Retries)
	}
	// Retry-After: 1 spaces the attempts: a host's requests that were
	// answered 503 are at least about a second apart.
	prev := map[string]time.Time{}
	for _, r := range reqs {
		if r.status != 503 {
			continue
		}
		if p, ok := prev[r.ev.HostID]; ok && r.at.Sub(p) < 900*time.Millisecond {
			t.Fatalf("host %s tried again %s after a 503 with Retry-After: 1", r.ev.HostID, r.at.Sub(p))
		}
		prev[r.ev.HostID] = r.at
	}
	check(t, reqs, sinktest.Log(t, pool), nil)
}

// Test400DeadLetters: the endpoint refuses one event with 400. Its unit is
// dead-lettered with the status and the answer's body; every other event,
// the host's later ones included, is delivered in order.
func Test400DeadLetters(t *testing.T) {
	t.Parallel()
	srv, url := newServer(t, func(r *request) (int, http.Header, string) {
		if r.ev.EventType == "bad" {
			return 400, nil, `{"error":"field amount must be positive"}`
		}
		return 200, nil, ""
	})
	pool := pgtest.TopicPool(t, 1)
	e := func(typ string) pgevents.Event {
		return pgevents.Event{HostID: "h", EventType: typ, Payload: []byte(`{}`)}
	}
	sinktest.AppendTx(t, pool, e("t"), e("t"))
	sinktest.AppendTx(t, pool, e("t"), e("bad"), e("t"))
	sinktest.AppendTx(t, pool, e("t"))
	consume(t, pool, 1, relay(t, webhook.Options{URL: url}))
	sinktest.WaitCaughtUp(t, pool, "g", 30*time.Second)
	dls := sinktest.DeadLetters(t, pool, "g")
	if len(dls) != 1 || dls[0].FirstOffset != 3 || dls[0].LastOffset != 5 || dls[0].Attempts != 1 ||
		!strings.Contains(dls[0].Error, "400 Bad Request") || !strings.Contains(dls[0].Error, "field amount must be positive") {
		t.Fatalf("dead letters %+v, want the unit at offsets 3-5 with the status and the body", dls)
	}
	skip := map[string]bool{}
	for _, id := range dls[0].EventIDs {
		skip[id] = true
	}
	reqs := srv.requests()
	// Offset 3 was delivered in the attempt that failed: a unit is not
	// atomic outside PostgreSQL.
	for _, r := range reqs {
		if r.ev.Offset == 3 {
			delete(skip, r.key)
		}
	}
	if dups := check(t, reqs, sinktest.Log(t, pool), skip); dups != 0 {
		t.Fatalf("%d duplicates: the retry sent again what was delivered", dups)
	}
}

// TestConcurrencyAcrossHosts: in one batch, host "slow"'s request is
// answered only once every other host's events have arrived: hosts are
// sent concurrently (a sequential relay would leave the slow request to
// time out), each host's events one at a time.
func TestConcurrencyAcrossHosts(t *testing.T) {
	t.Parallel()
	const hosts, perHost = 6, 5
	var fast atomic.Int64
	others := make(chan struct{})
	var once sync.Once
	var concurrent atomic.Int64 // requests of one host in flight at once, at most
	var perHostInflight sync.Map
	srv, url := newServer(t, func(r *request) (int, http.Header, string) {
		v, _ := perHostInflight.LoadOrStore(r.ev.HostID, new(atomic.Int64))
		n := v.(*atomic.Int64).Add(1)
		defer v.(*atomic.Int64).Add(-1)
		if n > concurrent.Load() {
			concurrent.Store(n)
		}
		if r.ev.HostID == "slow" {
			select {
			case <-others:
				return 200, nil, ""
			case <-time.After(10 * time.Second):
				return 500, nil, "the other hosts did not arrive while this request was in flight"
			}
		}
		if fast.Add(1) == hosts*perHost {
			once.Do(func() { close(others) })
		}
		time.Sleep(5 * time.Millisecond)
		return 200, nil, ""
	})
	pool := pgtest.TopicPool(t, 1)
	evs := []pgevents.Event{{HostID: "slow", EventType: "t", Payload: []byte(`{}`)}}
	for i := range perHost {
		for h := range hosts {
			evs = append(evs, pgevents.Event{HostID: fmt.Sprint("fast-", h), EventType: "t", Payload: []byte(fmt.Sprint(i))})
		}
	}
	sinktest.AppendTx(t, pool, evs...) // one batch
	consume(t, pool, 1, relay(t, webhook.Options{URL: url, Concurrency: 4}))
	sinktest.WaitCaughtUp(t, pool, "g", 30*time.Second)
	reqs := srv.requests()
	for _, r := range reqs {
		if r.status != 200 {
			t.Fatalf("request of host %s answered %d: hosts were not sent concurrently", r.ev.HostID, r.status)
		}
	}
	if p := srv.peak.Load(); p < 2 || p > 4 {
		t.Fatalf("at most %d requests in flight, want between 2 and the concurrency, 4", p)
	}
	if concurrent.Load() != 1 {
		t.Fatalf("%d requests of one host in flight at once, want 1", concurrent.Load())
	}
	check(t, reqs, sinktest.Log(t, pool), nil)
}

// TestClassify: each answer (and no answer) gets its class, outside a
// batch, where the relay sends at once.
func TestClassify(t *testing.T) {
	t.Parallel()
	var status atomic.Int64
	_, url := newServer(t, func(*request) (int, http.Header, string) {
		s := int(status.Load())
		if s == 0 {
			time.Sleep(300 * time.Millisecond)
			return 200, nil, ""
		}
		return s, http.Header{"Retry-After": {"2"}, "Location": {"/elsewhere"}}, strings.Repeat("why ", 200)
	})
	s := relay(t, webhook.Options{URL: url, Timeout: 100 * time.Millisecond})
	ev := &pgevents.Event{Offset: 1, EventID: "e1", HostID: "h", EventType: "t", Payload: []byte(`{}`)}
	for _, tc := range []struct {
		status int
		want   pgevents.Class
	}{
		{0, pgevents.ClassTransient}, // the request times out
		{408, pgevents.ClassTransient}, {429, pgevents.ClassTransient}, {500, pgevents.ClassTransient},
		{502, pgevents.ClassTransient}, {503, pgevents.ClassTransient},
		{401, pgevents.ClassDeployment}, {403, pgevents.ClassDeployment}, {301, pgevents.ClassDeployment},
		{400, pgevents.ClassPermanent}, {404, pgevents.ClassPermanent}, {422, pgevents.ClassPermanent},
	} {
		status.Store(int64(tc.status))
		err := s.Handle(context.Background(), nil, ev)
		if got := pgevents.Classify(err); got != tc.want {
			t.Errorf("status %d: %v, class %v, want %v", tc.status, err, got, tc.want)
		}
		var ce *pgevents.ClassifiedError
		if tc.status == 429 && (!errors.As(err, &ce) || ce.After != 2*time.Second) {
			t.Errorf("429 with Retry-After: 2: %+v, want a wait of 2 s", ce)
		}
		if tc.status == 400 && (!strings.Contains(err.Error(), "400 Bad Request: why why") || len(err.Error()) > 700) {
			t.Errorf("400: %q, want the status and the first 512 bytes of the body", err)
		}
	}
	status.Store(200)
	if err := s.Handle(context.Background(), nil, ev); err != nil {
		t.Fatal(err)
	}
	down := relay(t, webhook.Options{URL: "http://127.0.0.1:1/events"})
	if err := down.Handle(context.Background(), nil, ev); pgevents.Classify(err) != pgevents.ClassTransient {
		t.Fatalf("connection refused: %v, want transient", err)
	}
}

// TestCloudEvents: the structured-mode body.
func TestCloudEvents(t *testing.T) {
	t.Parallel()
	var got map[string]any
	var contentType string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		contentType = r.Header.Get("Content-Type")
		_ = json.NewDecoder(r.Body).Decode(&got)
	}))
	defer ts.Close()
	s := relay(t, webhook.Options{URL: ts.URL, Format: webhook.FormatCloudEvents, Source: "/portal",
		Headers: map[string]string{"Authorization": "Bearer x"}})
	created := time.Date(2025, 1, 2, 3, 4, 5, 6000, time.UTC)
	ev := &pgevents.Event{Offset: 9, TopicID: 1, PartitionID: 3, EventID: "e9", HostID: "h", UserID: "u", TransactionID: 77,
		EventType: "trade.booked", Payload: []byte(`{"id":100}`), CreatedAt: created}
	if err := s.Handle(context.Background(), nil, ev); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"specversion": "1.0", "id": "e9", "source": "/portal", "type": "trade.booked", "subject": "h",
		"time": "2025-01-02T03:04:05.000006Z", "datacontenttype": "application/json", "data": map[string]any{"id": float64(100)},
		"coffset": "9", "topicid": "1", "partitionid": "3", "transactionid": "77", "userid": "u"}
	if contentType != "application/cloudevents+json" || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s %v, want application/cloudevents+json %v", contentType, got, want)
	}
}

// TestInvalidOptions: New names the option at fault.
func TestInvalidOptions(t *testing.T) {
	t.Parallel()
	for key, o := range map[string]webhook.Options{
		"url":         {},
		"method":      {URL: "http://x", Method: "PO ST"},
		"headers":     {URL: "http://x", Headers: map[string]string{"Idempotency-Key": "x"}},
		"format":      {URL: "http://x", Format: "xml"},
		"concurrency": {URL: "http://x", Concurrency: -1},
	} {
		_, err := webhook.New(o)
		var oe *webhook.OptionError
		if !errors.As(err, &oe) || oe.Key != key {
			t.Errorf("%s: %v, want an OptionError for %s", key, err, key)
		}
	}
	if _, err := webhook.New(webhook.Options{URL: "ftp://x"}); err == nil {
		t.Error("ftp:// accepted")
	}
}

// TestRequestsCarryTraceContext: events appended inside a producer's span
// reach the endpoint with a traceparent header naming that span (its trace
// id and span id), both through a batch's lanes and through Handle called
// outside a batch; an event appended outside any span is sent without one.
func TestRequestsCarryTraceContext(t *testing.T) {
	t.Parallel()
	srv, url := newServer(t, nil)
	pool := pgtest.TopicPool(t, 2)
	s := relay(t, webhook.Options{URL: url})
	consume(t, pool, 2, s)
	sc := sinktest.AppendInSpan(t, pool,
		pgevents.Event{HostID: "h1", EventType: "traced", Payload: []byte(`{}`)},
		pgevents.Event{HostID: "h2", EventType: "traced", Payload: []byte(`{}`), Metadata: []byte(`{"m":1}`)})
	sinktest.AppendTx(t, pool, pgevents.Event{HostID: "h1", EventType: "plain", Payload: []byte(`{}`)})
	sinktest.WaitCaughtUp(t, pool, "g", time.Minute)
	want := sinktest.TraceParent(sc)
	reqs := srv.requests()
	if len(reqs) != 3 {
		t.Fatalf("%d requests, want 3", len(reqs))
	}
	for _, r := range reqs {
		switch {
		case r.ev.EventType == "traced" && r.trace != want:
			t.Fatalf("request of host %s: traceparent %q, want the producer's span %q (trace id %s)", r.ev.HostID, r.trace, want, sc.TraceID())
		case r.ev.EventType == "plain" && r.trace != "":
			t.Fatalf("request of an event appended outside a span: traceparent %q, want none", r.trace)
		}
	}
	// Outside a batch: the event's metadata, as a consumer would read it.
	ev := reqs[0].ev
	if ev.EventType != "traced" {
		ev = reqs[1].ev
	}
	if err := s.Handle(context.Background(), nil, &ev); err != nil {
		t.Fatal(err)
	}
	if got := srv.requests()[3].trace; got != want {
		t.Fatalf("outside a batch: traceparent %q, want %q", got, want)
	}
}
