package console

import (
	"context"
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
}

// groupSummary is a group on the overview.
type groupSummary struct {
	Topic       int
	Group       string
	State       string
	Lag         int64
	LagCapped   bool
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
		st, err := metrics.ReadState(ctx, c.pool, "", t.ID, metrics.DefaultLagCap)
		if err != nil {
			return "", "", nil, err
		}
		d.DBTime = st.DatabaseTime
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
			g.Lag += p.LagEvents
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
