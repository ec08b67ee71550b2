package console

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/metrics"
	"github.com/pgevents/pgevents/partition"
	"github.com/pgevents/pgevents/schema"
)

// partitionRow is one partition of a group on the group page.
type partitionRow struct {
	Partition   int
	Owner       string
	Epoch       int64
	Live        bool
	Acquired    *time.Time
	Heartbeat   *time.Time
	Expires     *time.Time
	Hostname    string
	Position    *int64
	Head        *int64
	Lag         int64
	LagCapped   bool
	LagSeconds  float64
	DeadLetters int64
	Halt        *metrics.Halt
	Parked      int64
	ParkedHosts []string
	// Rate is the partition's rate of events handled, from the samples;
	// the charts, its last hour.
	Rate      figure
	RateChart chart
	LagChart  chart
}

// groupData is the group page's.
type groupData struct {
	Topic      int
	Group      string
	Sub        *subscription
	Partitions []partitionRow
	Lag        int64
	LagCapped  bool    // Lag is an estimate (lagEstimate)
	LagSeconds float64 // of its most behind partition
	// Rate is the group's rate of events handled, from the samples;
	// Verdict whether it keeps up; the charts, its last hour.
	Rate      figure
	Verdict   verdict
	RateChart chart
	LagChart  chart
	AgeChart  chart
	DeadChart chart
	DBTime    time.Time
	Audit     []auditEntry
	Done      string // what the action just taken did
}

func (c *Console) groupPage(r *http.Request) (string, string, any, error) {
	topic, err := pathInt(r, "topic")
	if err != nil {
		return "", "", nil, err
	}
	group := r.PathValue("group")
	ctx, cancel := c.queryContext(r)
	defer cancel()
	d, err := c.groupData(ctx, topic, group)
	if err != nil {
		return "", "", nil, err
	}
	d.Done = flash(r.URL.Query())
	return "group", "Group " + group, d, nil
}

// groupData reads what the group page shows.
func (c *Console) groupData(ctx context.Context, topic int, group string) (*groupData, error) {
	d := &groupData{Topic: topic, Group: group}
	subs, err := c.subscriptions(ctx, topic)
	if err != nil {
		return nil, err
	}
	for i := range subs {
		if subs[i].Group == group {
			d.Sub = &subs[i]
		}
	}
	st, err := metrics.ReadState(ctx, c.pool, group, topic, lagCountCap)
	if err != nil {
		return nil, err
	}
	d.DBTime = st.DatabaseTime
	hasPosition := false
	for _, p := range st.Partitions {
		hasPosition = hasPosition || p.NextOffset != nil
	}
	if d.Sub == nil && !hasPosition {
		return nil, notFound("group %q has no subscription and no position on topic %d", group, topic)
	}
	scope, partitions, err := c.topicScope(ctx, topic)
	if err != nil {
		return nil, err
	}
	owners, err := c.ownership(ctx, group, topic)
	if err != nil {
		return nil, err
	}
	parked, err := c.parkedHosts(ctx, group, topic)
	if err != nil {
		return nil, err
	}
	hist, err := c.topicSamples(ctx, topic)
	if err != nil {
		return nil, err
	}
	samples, err := c.partitionSamples(ctx, topic, group)
	if err != nil {
		return nil, err
	}
	for _, p := range st.Partitions {
		row := partitionRow{Partition: p.Partition, Position: p.NextOffset, Head: p.LogEnd, Lag: lagEstimate(p, scope, partitions),
			LagCapped: p.LagCapped, LagSeconds: p.LagSeconds, DeadLetters: p.DeadLettersOpen, Halt: p.Halt}
		if o, ok := owners[p.Partition]; ok {
			row.Owner, row.Epoch, row.Live, row.Acquired, row.Heartbeat, row.Expires, row.Hostname =
				o.Owner, o.Epoch, o.Live, o.Acquired, o.Heartbeat, o.Expires, o.Hostname
		}
		if pk, ok := parked[p.Partition]; ok {
			row.Parked, row.ParkedHosts = pk.n, pk.hosts
		}
		if p.NextOffset != nil {
			d.Lag += row.Lag
			d.LagCapped = d.LagCapped || p.LagCapped
			d.LagSeconds = max(d.LagSeconds, p.LagSeconds)
		}
		rates := partitionRates(samples, p.Partition)
		row.Rate = lastPartitionRate(samples, p.Partition)
		row.RateChart = newChart("rate", "events handled per second, last hour", kindRate, smallChart, st.DatabaseTime, emptyChart(len(samples)),
			chartSeries{Name: "handled", Points: rates, Data: true})
		row.LagChart = newChart("lag", "lag in events, last hour", kindCount, smallChart, st.DatabaseTime, "no sample yet",
			chartSeries{Name: "lag", Points: partitionLags(samples, p.Partition), Data: true})
		d.Partitions = append(d.Partitions, row)
	}
	ss := samples
	d.Rate = lastRate(groupRates(ss))
	d.Verdict = judge(d.Lag, d.LagSeconds, st.DatabaseTime, ss)
	end := st.DatabaseTime
	d.RateChart = newChart("rate", "events handled per second (line) and appended to the topic (grey), last hour", kindRate, wideChart, end,
		emptyChart(len(ss)), chartSeries{Name: "appended", Points: ratePoints(topicRates(hist.Samples)), Data: true},
		chartSeries{Name: "handled", Points: ratePoints(groupRates(ss)), Data: true})
	d.LagChart = newChart("lag", "lag in events, last hour", kindCount, wideChart, end, emptyChart(0),
		chartSeries{Name: "lag", Points: groupPoints(ss, lagOf), Data: true})
	d.AgeChart = newChart("age", "lag age (the oldest unhandled event's), last hour", kindAge, wideChart, end, emptyChart(0),
		chartSeries{Name: "age", Points: groupPoints(ss, ageOf), Data: true})
	d.DeadChart = newChart("dead", "dead letters written per minute, last hour", kindPerMinute, wideChart, end, emptyChart(len(ss)),
		chartSeries{Name: "dead", Points: deadPerMinute(ss), Data: true})
	if d.Audit, err = c.audit(ctx, group, topic, false, 20); err != nil {
		return nil, err
	}
	return d, nil
}

// lease is a row of partition_ownership.
type lease struct {
	Owner     string
	Epoch     int64
	Acquired  *time.Time
	Heartbeat *time.Time
	Expires   *time.Time
	Live      bool
	Hostname  string
}

// ownership reads the lease of each partition of the group
// (partition.Owners).
func (c *Console) ownership(ctx context.Context, group string, topic int) (map[int]lease, error) {
	owners, err := partition.Owners(ctx, c.pool, group, topic)
	if err != nil {
		return nil, fmt.Errorf("console: leases: %w", err)
	}
	out := make(map[int]lease, len(owners))
	for _, o := range owners {
		out[o.Partition] = lease{Owner: o.Replica, Epoch: o.Epoch, Acquired: timeOrNil(o.Acquired),
			Heartbeat: timeOrNil(o.Heartbeat), Expires: timeOrNil(o.Expires), Live: o.Live, Hostname: o.Hostname}
	}
	return out, nil
}

// timeOrNil is t, or nil when t is zero (none).
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

type parkedCount struct {
	n     int64
	hosts []string
}

// parkedHosts reads the parked hosts of each partition of the group.
func (c *Console) parkedHosts(ctx context.Context, group string, topic int) (map[int]parkedCount, error) {
	rows, err := c.pool.Query(ctx, schema.SQL(ctx, parkedHostsSQL), group, topic)
	if err != nil {
		return nil, fmt.Errorf("console: parked hosts: %w", err)
	}
	out := map[int]parkedCount{}
	var (
		p  int
		pc parkedCount
	)
	if _, err := pgx.ForEachRow(rows, []any{&p, &pc.n, &pc.hosts}, func() error {
		out[p] = pc
		return nil
	}); err != nil {
		return nil, fmt.Errorf("console: parked hosts: %w", err)
	}
	return out, nil
}
