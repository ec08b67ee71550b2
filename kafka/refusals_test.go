package kafka_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/kafka"
)

// refusalLines returns the log lines in buf (JSON objects) whose message
// is the endpoint's refusal line.
func refusalLines(t *testing.T, buf *logtest.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if line == "" {
			continue
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["message"] == "kafka: request refused" {
			out = append(out, m)
		}
	}
	return out
}

// TestRefusalsAreLogged: what the endpoint refuses is logged with its
// reason, Kafka error code and client: the first refusal at once, then at
// most one line per interval per client and kind, counting the refusals
// it did not log. A produce's INVALID_RECORD (older Produce versions carry
// no error message to the client) is logged, and so is a refused commit,
// under a kind of its own.
func TestRefusalsAreLogged(t *testing.T) {
	t.Parallel()
	lines := logtest.New(t)
	log := zerolog.New(lines)
	e := newEnv(t, 1, "", kafka.Options{Logger: &log})
	rc := dialRaw(t, e.addr)
	bad := produceRequest(7, "events", map[int32][]byte{0: encodeBatch(t, -1, 0, nil, rec{value: []byte(`{}`)})}) // no key
	for range 5 {
		resp, err := rc.do(bad)
		if err != nil {
			t.Fatal(err)
		}
		if c := resp.(*kmsg.ProduceResponse).Topics[0].Partitions[0].ErrorCode; c != kerr.InvalidRecord.Code {
			t.Fatalf("a record without a key: %v, want INVALID_RECORD", kerr.ErrorForCode(c))
		}
	}
	got := refusalLines(t, lines)
	if len(got) != 1 || got[0]["request"] != "produce" || got[0]["error_code"] != float64(kerr.InvalidRecord.Code) ||
		!strings.Contains(got[0]["reason"].(string), "needs a key") || got[0]["client_id"] != "raw" {
		t.Fatalf("after 5 refused produces, the refusal lines are %v; want one, for produce, INVALID_RECORD, saying the record needs a key", got)
	}
	e.srv.SetRefusalInterval(time.Nanosecond)
	if _, err := rc.do(bad); err != nil {
		t.Fatal(err)
	}
	got = refusalLines(t, lines)
	if len(got) != 2 || got[1]["refused_since_last_line"] != float64(4) {
		t.Fatalf("the next line after the interval: %v; want it to count the 4 refusals not logged", got)
	}
	if c := commitRaw(t, rc, "g", "", -1, map[int32]int64{7: 1})[7]; c != kerr.UnknownTopicOrPartition.Code {
		t.Fatalf("a commit of partition 7 of a topic of 1: %v, want UNKNOWN_TOPIC_OR_PARTITION", kerr.ErrorForCode(c))
	}
	got = refusalLines(t, lines)
	if len(got) != 3 || got[2]["request"] != "commit" || got[2]["kafka_group"] != "g" || got[2]["partition"] != float64(7) {
		t.Fatalf("after a refused commit, the refusal lines are %v; want a third, for the commit of group g, partition 7", got)
	}
}

// TestTransactionsRefusedAtOnce: a transactional producer's
// FindCoordinator of a transaction coordinator is answered
// TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as its InitProducerId is, never a
// retriable error it would retry for ever.
func TestTransactionsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 1, "", kafka.Options{})
	fc := kmsg.NewPtrFindCoordinatorRequest()
	fc.SetVersion(3)
	fc.CoordinatorKey, fc.CoordinatorType = "tx-1", 1
	resp, err := dialRaw(t, e.addr).do(fc)
	if err != nil {
		t.Fatal(err)
	}
	if c := resp.(*kmsg.FindCoordinatorResponse).ErrorCode; c != kerr.TransactionalIDAuthorizationFailed.Code {
		t.Errorf("FindCoordinator of a transaction coordinator: %v, want TRANSACTIONAL_ID_AUTHORIZATION_FAILED", kerr.ErrorForCode(c))
	}
	ip := kmsg.NewPtrInitProducerIDRequest()
	ip.SetVersion(4)
	ip.TransactionalID = kmsg.StringPtr("tx-1")
	resp, err = dialRaw(t, e.addr).do(ip)
	if err != nil {
		t.Fatal(err)
	}
	if c := resp.(*kmsg.InitProducerIDResponse).ErrorCode; c != kerr.TransactionalIDAuthorizationFailed.Code {
		t.Errorf("InitProducerId with a transactional id: %v, want TRANSACTIONAL_ID_AUTHORIZATION_FAILED", kerr.ErrorForCode(c))
	}
}
