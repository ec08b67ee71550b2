package kafka

import (
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// refusalInterval is how often the endpoint logs one kind of refusal of
// one client: the first at once, the next ones at most once an interval,
// with how many were refused meanwhile.
const refusalInterval = 10 * time.Second

// refusals logs what the endpoint refuses (a produce's invalid record, a
// commit or a join refused): older request versions carry no error
// message, so the client cannot show the reason, and the operator reads
// it here. A client that retries a refused request in a loop makes one
// line an interval, not one per request.
type refusals struct {
	mu    sync.Mutex
	last  map[refusalKey]*refusalState
	every time.Duration // refusalInterval unless a test set it
}

type refusalKey struct{ client, kind string }

type refusalState struct {
	at         time.Time // of the last line
	suppressed int       // refusals since, not logged
}

// refusal is one refusal to log: the client's address and id, the kind
// ("produce", "commit", "join"), the Kafka error code answered and why.
type refusal struct {
	addr, clientID, kind string
	code                 int16
	reason               string
	group, topic         string
	partition            int32
}

// log writes r's line when its client and kind have had none for
// refusalInterval, and counts it otherwise.
func (rs *refusals) log(l *zerolog.Logger, r refusal) {
	now := time.Now()
	k := refusalKey{client: r.addr, kind: r.kind}
	rs.mu.Lock()
	if rs.last == nil {
		rs.last = map[refusalKey]*refusalState{}
	}
	every := rs.every
	if every == 0 {
		every = refusalInterval
	}
	st := rs.last[k]
	if st != nil && now.Sub(st.at) < every {
		st.suppressed++
		rs.mu.Unlock()
		return
	}
	if st == nil {
		st = &refusalState{}
		rs.last[k] = st
	}
	more := st.suppressed
	st.at, st.suppressed = now, 0
	// Forget clients gone quiet, so the map stays small.
	for key, s := range rs.last {
		if now.Sub(s.at) > 10*every {
			delete(rs.last, key)
		}
	}
	rs.mu.Unlock()
	ev := l.Warn().Str("client", r.addr).Str("client_id", r.clientID).Str("request", r.kind).Int16("error_code", r.code).
		Str("reason", r.reason)
	if r.group != "" {
		ev = ev.Str("kafka_group", r.group)
	}
	if r.topic != "" {
		ev = ev.Str("kafka_topic", r.topic).Int32("partition", r.partition)
	}
	if more > 0 {
		ev = ev.Int("refused_since_last_line", more)
	}
	ev.Msg("kafka: request refused")
}

// refuse logs a refusal of one of cn's requests (see refusals).
func (cn *conn) refuse(kind string, code int16, reason, group, topic string, partition int32) {
	cn.s.refusals.log(&cn.s.log, refusal{addr: cn.c.RemoteAddr().String(), clientID: cn.client, kind: kind, code: code,
		reason: reason, group: group, topic: topic, partition: partition})
}

// who names cn's client for the audit and the group's holder row: the SASL
// user when there is one, with the client id.
func (cn *conn) who() string {
	switch {
	case cn.user != "" && cn.client != "":
		return fmt.Sprintf("user %s (client %s)", cn.user, cn.client)
	case cn.user != "":
		return "user " + cn.user
	case cn.client != "":
		return "client " + cn.client
	}
	return "an anonymous client"
}
