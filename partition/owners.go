package partition

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// ownersSQL reads the lease of every partition of group $1 on topic $2,
// live or not, from the partition_ownership view: a lease row (owner,
// epoch) changes only when the partition changes hands, and it is live
// while its owner's consumer_replicas row has not expired on the database
// clock. An infinite expiry (a lease without a replica row) reads as none.
const ownersSQL = `SELECT w.partition_id, coalesce(w.owner, ''), w.epoch, w.acquired_at, w.heartbeat_at,
       CASE WHEN isfinite(w.expires_at) THEN w.expires_at END, coalesce(w.live, false), coalesce(w.hostname, '')
FROM {schema}partition_ownership w
WHERE w.group_id = $1 AND w.topic_id = $2
ORDER BY w.partition_id`

// Owner is the lease of one partition of a consumer group.
type Owner struct {
	// Partition is the partition.
	Partition int
	// Replica is the id of the replica that holds the lease; "" when the
	// lease is free.
	Replica string
	// Epoch is the lease's epoch, the fencing token handed to the owner's
	// handlers: it grows each time the partition changes hands.
	Epoch int64
	// Acquired is when the owner took the lease (zero when never).
	Acquired time.Time
	// Heartbeat is the owner's last renewal, on the database clock (zero
	// when the owner has no replica row).
	Heartbeat time.Time
	// Expires is when the lease lapses unless its owner renews it: its
	// replica row's expiry, on the database clock (zero when none).
	Expires time.Time
	// Live says that the lease is held: it has an owner whose replica row
	// has not expired. A lease that is not live is taken over by the next
	// replica that looks for work.
	Live bool
	// Hostname is the owner's host, as it registered.
	Hostname string
}

// Owners returns who owns each partition of the consumer group on topic, in
// partition order: the replica, the lease's epoch and its expiry, read from
// the leases the group's replicas write. A partition the group has no lease
// row for (it never started there) is absent. Owners takes no lock: a lease
// may change hands as soon as it is read.
func Owners(ctx context.Context, db schema.DB, group string, topic int) ([]Owner, error) {
	rows, err := db.Query(ctx, schema.SQL(ctx, ownersSQL), group, topic)
	if err != nil {
		return nil, fmt.Errorf("partition: owners: %w", err)
	}
	var (
		out                          []Owner
		o                            Owner
		acquired, heartbeat, expires *time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&o.Partition, &o.Replica, &o.Epoch, &acquired, &heartbeat, &expires, &o.Live, &o.Hostname}, func() error {
		o.Acquired, o.Heartbeat, o.Expires = deref(acquired), deref(heartbeat), deref(expires)
		out = append(out, o)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("partition: owners: %w", err)
	}
	return out, nil
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}
