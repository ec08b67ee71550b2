package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/metrics"
	"github.com/pgevents/pgevents/schema"
)

// topicView is a topic on the overview.
type topicView struct {
	ID           int
	Partitions   int
	Scope        string
	Allocation   string
	SegmentSize  int64
	Channel      string
	Wake         string
	Retention    string
	MaxRetention string
	ZeroSubs     string
	RemovedBelow int64
	Head         *int64
	Rate         float64 // appended events per second; -1: unknown
	Hist         []float64
	Groups       []groupSummary
	// Sequencer is the topic's sequencer, for a sequenced topic; nil
	// otherwise.
	Sequencer *metrics.Sequencer
}

// groupSummary is a group on the overview.
type groupSummary struct {
	Topic       int
	Group       string
	State       string
	Lag         int64
	LagCapped   bool    // Lag is an estimate (lagEstimate)
	LagSeconds  float64 // of its most behind partition
	DeadLetters int64
	Halted      int
	Owned       int // partitions with a live lease
	Partitions  int
	LastSeen    time.Time
	Rate        float64 // handled events per second; -1: unknown
	Hist        []float64
}

// subscription is a row of subscriptions.
type subscription struct {
	Topic     int
	Group     string
	State     string
	StartFrom string
	Created   time.Time
	Changed   time.Time
	LastSeen  time.Time
	DeadAfter float64
	Layout    int
}

// overviewData is the overview's.
type overviewData struct {
	Topics []topicView
	DBTime time.Time
}

func (c *Console) overview(r *http.Request) (string, string, any, error) {
	ctx, cancel := c.queryContext(r)
	defer cancel()
	topics, err := c.topics(ctx)
	if err != nil {
		return "", "", nil, err
	}
	subs, err := c.subscriptions(ctx, 0)
	if err != nil {
		return "", "", nil, err
	}
	d := overviewData{}
	for i := range topics {
		t := &topics[i]
		st, err := metrics.ReadState(ctx, c.pool, "", t.ID, lagCountCap)
		if err != nil {
			return "", "", nil, err
		}
		d.DBTime = st.DatabaseTime
		t.Sequencer = st.Sequencer
		byGroup := map[string]*groupSummary{}
		var order []string
		for _, s := range subs {
			if s.Topic == t.ID {
				byGroup[s.Group] = &groupSummary{Topic: t.ID, Group: s.Group, State: s.State, LastSeen: s.LastSeen, Rate: -1}
				order = append(order, s.Group)
			}
		}
		heads := map[int32]int64{}
		positions := map[string]map[int32]int64{}
		for _, p := range st.Partitions {
			g := byGroup[p.Group]
			if g == nil {
				g = &groupSummary{Topic: t.ID, Group: p.Group, State: "-", Rate: -1}
				byGroup[p.Group] = g
				order = append(order, p.Group)
			}
			g.Partitions++
			g.Lag += lagEstimate(p, t.Scope, t.Partitions)
			g.LagCapped = g.LagCapped || p.LagCapped
			g.LagSeconds = max(g.LagSeconds, p.LagSeconds)
			g.DeadLetters += p.DeadLettersOpen
			if p.Halt != nil {
				g.Halted++
			}
			if p.Lease != nil {
				g.Owned++
			}
			if p.LogEnd != nil {
				heads[int32(p.Partition)] = max(heads[int32(p.Partition)], *p.LogEnd+1)
			}
			if p.NextOffset != nil {
				if positions[p.Group] == nil {
					positions[p.Group] = map[int32]int64{}
				}
				positions[p.Group][int32(p.Partition)] = *p.NextOffset
			}
		}
		t.Rate = -1
		if len(heads) > 0 {
			t.Rate, t.Hist = c.rates.observe(ctx, c.pool, "topic/"+strconv.Itoa(t.ID), t.ID, heads, st.DatabaseTime)
		}
		for _, name := range order {
			g := byGroup[name]
			if pos := positions[name]; len(pos) > 0 {
				g.Rate, g.Hist = c.rates.observe(ctx, c.pool, "group/"+strconv.Itoa(t.ID)+"/"+name, t.ID, pos, st.DatabaseTime)
			}
			t.Groups = append(t.Groups, *g)
		}
	}
	d.Topics = topics
	return "overview", "Overview", d, nil
}

// lagCountCap caps the events counted for a partition's lag (through the
// log's index, metrics.ReadState): beyond it the lag shown is an estimate
// (lagEstimate). Counting the 100,000 of metrics.DefaultLagCap in each of
// 16 partitions of a group far behind took most of a second.
const lagCountCap = 1000

// lagEstimate is partition p's lag: the events counted when there were
// fewer than lagCountCap; otherwise an estimate from the offsets, at least
// what was counted: the offsets between the group's position and the head
// (consecutive in a partition under offset scope partition, shared by
// every partition under scope topic, where a partition holds about
// 1/partitions of them: hosts spread evenly). LagCapped marks it.
func lagEstimate(p metrics.PartitionState, scope string, partitions int) int64 {
	if !p.LagCapped || p.NextOffset == nil || p.LogEnd == nil {
		return p.LagEvents
	}
	span := *p.LogEnd + 1 - *p.NextOffset
	if scope != "partition" && partitions > 1 {
		span /= int64(partitions)
	}
	return max(p.LagEvents, span)
}

// topicScope reads topic's offset scope and partition count (topicScopeSQL).
func (c *Console) topicScope(ctx context.Context, topic int) (string, int, error) {
	var (
		scope string
		n     int
	)
	err := c.pool.QueryRow(ctx, schema.SQL(ctx, topicScopeSQL), topic).Scan(&scope, &n)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", 0, fmt.Errorf("console: topic %d: %w", topic, err)
	}
	return scope, n, nil
}

// topics reads every topic (topicsSQL).
func (c *Console) topics(ctx context.Context) ([]topicView, error) {
	rows, err := c.pool.Query(ctx, schema.SQL(ctx, topicsSQL))
	if err != nil {
		return nil, fmt.Errorf("console: topics: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (topicView, error) {
		var t topicView
		err := row.Scan(&t.ID, &t.Partitions, &t.Scope, &t.Allocation, &t.SegmentSize, &t.Channel, &t.Wake,
			&t.Retention, &t.MaxRetention, &t.ZeroSubs, &t.RemovedBelow, &t.Head)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("console: topics: %w", err)
	}
	return out, nil
}

// subscriptions reads the groups of topic (every topic when 0).
func (c *Console) subscriptions(ctx context.Context, topic int) ([]subscription, error) {
	rows, err := c.pool.Query(ctx, schema.SQL(ctx, subscriptionsSQL), topic)
	if err != nil {
		return nil, fmt.Errorf("console: subscriptions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (subscription, error) {
		var s subscription
		err := row.Scan(&s.Topic, &s.Group, &s.State, &s.StartFrom, &s.Created, &s.Changed, &s.LastSeen, &s.DeadAfter, &s.Layout)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("console: subscriptions: %w", err)
	}
	return out, nil
}

// pathInt reads the path value name as an integer.
func pathInt(r *http.Request, name string) (int, error) {
	v := r.PathValue(name)
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, badRequest("%s %q is not a number", name, v)
	}
	return n, nil
}
