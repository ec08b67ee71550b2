package console

import (
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// replicaRow is a row of consumer_replicas.
type replicaRow struct {
	Group        string
	Topic        int
	ID           string
	Mode         string
	Hostname     string
	PID          int
	Started      time.Time
	Heartbeat    time.Time
	Expires      time.Time
	Live         bool
	HeartbeatAge float64 // seconds, on the database clock
	Partitions   []int32
}

// replicasData is the replicas page's.
type replicasData struct {
	Live    []replicaRow
	Expired []replicaRow
}

func (c *Console) replicasPage(r *http.Request) (string, string, any, error) {
	ctx, cancel := c.queryContext(r)
	defer cancel()
	rows, err := c.pool.Query(ctx, schema.SQL(ctx, replicasSQL))
	if err != nil {
		return "", "", nil, fmt.Errorf("console: replicas: %w", err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowToStructByPos[replicaRow])
	if err != nil {
		return "", "", nil, fmt.Errorf("console: replicas: %w", err)
	}
	var d replicasData
	for _, x := range all {
		if x.Live {
			d.Live = append(d.Live, x)
		} else {
			d.Expired = append(d.Expired, x)
		}
	}
	return "replicas", "Replicas", d, nil
}
