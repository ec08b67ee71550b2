package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/metrics"
	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/schema"
)

// topicView is a topic on the overview.
type topicView struct {
	ID          int
	Partitions  int
	Scope       string
	Allocation  string
	SegmentSize int64
	Channel     string
	Wake        string
	// Retention, MaxRetention and ZeroSubs are the topic's retention
	// settings, in seconds; nil: none.
	Retention    *float64
	MaxRetention *float64
	ZeroSubs     *float64
	RemovedBelow int64
	Head         *int64
	// Appended is the rate of events appended, from the samples, and
	// AppendedChart its last hour.
	Appended      figure
	AppendedChart chart
	Groups        []groupSummary
	// The roles that keep the topic moving: the elected watcher, the
	// sequencer (a sequenced topic's; nil otherwise), maintenance (its
	// last pass, from the samples), and the server's notification queue.
	Watcher     offsets.Watcher
	Sequencer   *metrics.Sequencer
	Maintenance maintenanceView
	QueueUsage  float64
}

// maintenanceView is the topic's maintenance as its samples show it.
type maintenanceView struct {
	Never  bool    // no sample was ever written
	Writer string  // the session of the newest sample's pass
	Age    float64 // seconds since it
	Stale  bool    // older than staleAfter: no process runs maintenance
	Limit  float64 // staleAfter, in seconds
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
	// Rate is the rate of events handled, from the samples; Verdict
	// whether it keeps up; the charts, its last hour.
	Rate      figure
	Verdict   verdict
	RateChart chart
	LagChart  chart
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
		t.Sequencer, t.QueueUsage = st.Sequencer, st.NotificationQueueUsage
		if t.Watcher, err = offsets.Watchers(ctx, c.pool, t.ID); err != nil {
			return "", "", nil, fmt.Errorf("console: watcher of topic %d: %w", t.ID, err)
		}
		hist, err := c.topicSamples(ctx, t.ID)
		if err != nil {
			return "", "", nil, err
		}
		t.Maintenance = maintenanceOf(hist, st.DatabaseTime)
		t.Appended = lastRate(topicRates(hist.Samples))
		appended := ratePoints(topicRates(hist.Samples))
		t.AppendedChart = newChart("appended", "events appended per second, last hour", kindRate, topicChart, st.DatabaseTime,
			emptyChart(len(hist.Samples)), chartSeries{Name: "appended", Points: appended, Data: true})
		samples, err := c.groupSamples(ctx, t.ID)
		if err != nil {
			return "", "", nil, err
		}
		byGroup := map[string]*groupSummary{}
		var order []string
		for _, s := range subs {
			if s.Topic == t.ID {
				byGroup[s.Group] = &groupSummary{Topic: t.ID, Group: s.Group, State: s.State, LastSeen: s.LastSeen}
				order = append(order, s.Group)
			}
		}
		for _, p := range st.Partitions {
			g := byGroup[p.Group]
			if g == nil {
				g = &groupSummary{Topic: t.ID, Group: p.Group, State: "-"}
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
		}
		for _, name := range order {
			g := byGroup[name]
			ss := samples[name]
			g.Rate = lastRate(groupRates(ss))
			g.Verdict = judge(g.Lag, g.LagSeconds, st.DatabaseTime, ss)
			g.RateChart = newChart("rate", "events handled per second (line) and appended (grey), last hour", kindRate, smallChart,
				st.DatabaseTime, emptyChart(len(ss)),
				chartSeries{Name: "appended", Points: slices.Clone(appended)},
				chartSeries{Name: "handled", Points: ratePoints(groupRates(ss)), Data: true})
			g.LagChart = newChart("lag", "lag in events, last hour", kindCount, smallChart, st.DatabaseTime, "no sample yet",
				chartSeries{Name: "lag", Points: groupPoints(ss, lagOf), Data: true})
			t.Groups = append(t.Groups, *g)
		}
	}
	d.Topics = topics
	return "overview", "Overview", d, nil
}

// maintenanceOf is what the samples say of the topic's maintenance at
// the database time now.
func maintenanceOf(h topicHistory, now time.Time) maintenanceView {
	if h.Newest == nil {
		return maintenanceView{Never: true, Stale: true}
	}
	limit := staleAfter(h.Samples)
	age := max(now.Sub(h.Newest.At), 0)
	return maintenanceView{Writer: h.Newest.Writer, Age: age.Seconds(), Stale: age > limit, Limit: limit.Seconds()}
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
