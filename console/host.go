package console

import (
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// hostInGroup is where a host stands in one group.
type hostInGroup struct {
	Group       string
	State       string
	Layout      int
	Partition   int
	Position    *int64
	LastOffset  *int64 // the host's last event handled
	LastCreated *time.Time
	HandledBy   *time.Time
	NextOffset  *int64 // the host's next event to handle
	NextCreated *time.Time
	Ahead       *int64 // events of the partition before it
	DeadLetters []int64
	Parked      int64 // the host's events parked
	ParkedAt    *time.Time
	blocks
}

// Waiting reports whether the group has an event of the host to handle.
func (h *hostInGroup) Waiting() bool { return h.NextOffset != nil || h.Parked > 0 }

// hostData is the host page's.
type hostData struct {
	Topic  int
	Host   string
	Events []eventRow
	Groups []hostInGroup
	Cap    int64
}

func (c *Console) hostPage(r *http.Request) (string, string, any, error) {
	topic, err := pathInt(r, "topic")
	if err != nil {
		return "", "", nil, err
	}
	host := r.URL.Query().Get("host")
	d := hostData{Topic: topic, Host: host, Cap: countCap}
	if host == "" {
		return "host", "Host", d, nil
	}
	ctx, cancel := c.queryContext(r)
	defer cancel()
	rows, err := c.pool.Query(ctx, schema.SQL(ctx, hostEventsSQL), topic, host, 20)
	if err != nil {
		return "", "", nil, fmt.Errorf("console: host events: %w", err)
	}
	if d.Events, err = pgx.CollectRows(rows, scanEvent); err != nil {
		return "", "", nil, fmt.Errorf("console: host events: %w", err)
	}
	rows, err = c.pool.Query(ctx, schema.SQL(ctx, hostPathSQL), topic, host, countCap)
	if err != nil {
		return "", "", nil, fmt.Errorf("console: host path: %w", err)
	}
	d.Groups, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (hostInGroup, error) {
		var g hostInGroup
		err := row.Scan(&g.Group, &g.State, &g.Layout, &g.Partition, &g.Position, &g.LastOffset, &g.LastCreated, &g.HandledBy,
			&g.NextOffset, &g.NextCreated, &g.Ahead, &g.DeadLetters, &g.Parked, &g.HaltOffset, &g.HaltReason, &g.HaltedAt,
			&g.HostParked, &g.ParkedAt, &g.Owner, &g.Live, &g.LeaseExpiry)
		return g, err
	})
	if err != nil {
		return "", "", nil, fmt.Errorf("console: host path: %w", err)
	}
	return "host", "Host " + host, d, nil
}
