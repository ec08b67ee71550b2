package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/schema"
)

// Which gateway coordinates a group (migration 0017).
const (
	// registerSQL records the gateway's node and address, and names its
	// coordinator session after the node.
	registerSQL = `WITH s AS (SELECT set_config('application_name', $4, false), set_config('statement_timeout', '0', false),
                          set_config('idle_session_timeout', '0', false))
INSERT INTO {schema}kafka_gateways AS g (node_id, host, port) SELECT $1, $2, $3 FROM s
ON CONFLICT (node_id) DO UPDATE SET host = excluded.host, port = excluded.port, started_at = clock_timestamp()`

	// tryCoordinateSQL takes group $1's coordinator key for the session,
	// if nobody holds it.
	tryCoordinateSQL = `SELECT pg_try_advisory_lock({schema}lock_key('kafka-group', $1))`

	// holderSQL names the node whose session holds group $1's coordinator
	// key, and its address (no row: nobody holds it, or the holder is not a
	// gateway of this schema).
	holderSQL = `SELECT g.node_id, g.host, g.port
FROM (SELECT {schema}lock_key('kafka-group', $1) AS key) k
JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((k.key >> 32) & 4294967295)::oid AND l.objid = (k.key & 4294967295)::oid
JOIN pg_stat_activity a ON a.pid = l.pid
JOIN {schema}kafka_gateways g ON a.application_name = $2 || g.node_id::text`

	// gatewaysSQL lists the gateways' nodes.
	gatewaysSQL = `SELECT g.node_id, g.host, g.port FROM {schema}kafka_gateways g ORDER BY g.node_id`
)

// sessionPrefix starts the application_name of a gateway's coordinator
// session; the node id follows.
const sessionPrefix = "pgevents kafka "

// leaseCheck is how often the coordinator session is checked: when it is
// lost, its keys went with it, and the gateway stops coordinating.
const leaseCheck = time.Second

// node is a gateway as clients reach it.
type node struct {
	id   int32
	host string
	port int32
}

// leases holds, on one session of the gateway's, the coordinator keys of
// the groups it coordinates.
type leases struct {
	s     *Server
	mu    sync.Mutex
	conn  *pgxpool.Conn // nil while no session
	owned map[string]bool
	// held are the groups whose name the session holds (offsets.HoldGroup:
	// pgevents replicas of the group refuse to run), with the description
	// it holds them under.
	held map[string]string
}

func newLeases(s *Server) *leases {
	return &leases{s: s, owned: map[string]bool{}, held: map[string]string{}}
}

// holderName is how a gateway describes itself as a group's holder: what
// `consumer run` prints when it refuses to start a group of that name.
func (l *leases) holderName() string {
	return fmt.Sprintf("Kafka group members (Kafka endpoint node %d at %s:%d)", l.s.opts.NodeID, l.s.host, l.s.port)
}

// hold takes group's name on the coordinator session (offsets.HoldGroup),
// or updates its description: the group's pgevents replicas refuse to run
// while it is held. It returns a *offsets.GroupInUseError while a replica
// of the group is live, errNotCoordinator when this gateway does not
// coordinate the group.
func (l *leases) hold(ctx context.Context, group, detail string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.owned[group] || l.conn == nil {
		return errNotCoordinator
	}
	if d, ok := l.held[group]; ok && d == detail {
		return nil
	}
	if err := offsets.HoldGroup(ctx, l.conn, group, l.holderName(), detail); err != nil {
		if l.conn.Conn().IsClosed() {
			l.lost(ctx, err)
			return errNotCoordinator
		}
		return err
	}
	l.held[group] = detail
	return nil
}

// releaseIf gives group's name back when the session holds it and idle
// says, under the lock that hold takes, that the group has no member and
// none joining: its pgevents replicas may run again.
func (l *leases) releaseIf(ctx context.Context, group string, idle func() bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.held[group]; !ok || l.conn == nil || !idle() {
		return
	}
	if err := offsets.ReleaseGroup(ctx, l.conn, group); err != nil {
		if l.conn.Conn().IsClosed() {
			l.lost(ctx, err)
		}
		return
	}
	delete(l.held, group)
}

// heldGroups returns the groups whose name the session holds, with their
// descriptions.
func (l *leases) heldGroups() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]string, len(l.held))
	for g, d := range l.held {
		out[g] = d
	}
	return out
}

// errNoSession is returned while the gateway has no coordinator session.
var errNoSession = errors.New("kafka: no coordinator session")

// coordinator says which node coordinates group: this one when it holds
// the group's key or takes it now.
func (l *leases) coordinator(ctx context.Context, group string) (node, bool, error) {
	self := node{id: l.s.opts.NodeID, host: l.s.host, port: l.s.port}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.owned[group] {
		return self, true, nil
	}
	if l.conn == nil {
		return node{}, false, errNoSession
	}
	var got bool
	if err := l.conn.QueryRow(ctx, schema.SQL(ctx, tryCoordinateSQL), group).Scan(&got); err != nil {
		l.lost(ctx, err)
		return node{}, false, err
	}
	if got {
		l.owned[group] = true
		l.s.log.Info().Str("group", group).Msg("kafka: coordinating the group")
		return self, true, nil
	}
	var n node
	err := l.conn.QueryRow(ctx, schema.SQL(ctx, holderSQL), group, sessionPrefix).Scan(&n.id, &n.host, &n.port)
	if errors.Is(err, pgx.ErrNoRows) {
		return node{}, false, fmt.Errorf("kafka: group %q's coordinator key is held by no known gateway", group)
	}
	if err != nil {
		l.lost(ctx, err)
		return node{}, false, err
	}
	return n, false, nil
}

// owns reports whether this gateway coordinates group, taking its key
// when nobody holds it.
func (l *leases) owns(ctx context.Context, group string) bool {
	_, own, err := l.coordinator(ctx, group)
	return err == nil && own
}

// errNotCoordinator is returned by onSession when this gateway does not
// coordinate the group (any more).
var errNotCoordinator = errors.New("kafka: not the group's coordinator")

// onSession runs fn on the coordinator session, if this gateway
// coordinates group: a write of the group's (its committed offsets) made
// there is fenced, since a session that lost the group's key is gone, and
// so fn fails.
func (l *leases) onSession(ctx context.Context, group string, fn func(db schema.DB) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.owned[group] || l.conn == nil {
		return errNotCoordinator
	}
	if err := fn(l.conn); err != nil {
		if l.conn.Conn().IsClosed() {
			l.lost(ctx, err)
			return errNotCoordinator
		}
		return err
	}
	return nil
}

// gateways lists the gateways' nodes (this one at least).
func (l *leases) gateways(ctx context.Context) []node {
	self := node{id: l.s.opts.NodeID, host: l.s.host, port: l.s.port}
	out := []node{self}
	rows, err := l.s.pool.Query(ctx, schema.SQL(ctx, gatewaysSQL))
	if err != nil {
		return out
	}
	var n node
	_, _ = pgx.ForEachRow(rows, []any{&n.id, &n.host, &n.port}, func() error {
		if n.id != self.id {
			out = append(out, n)
		}
		return nil
	})
	return out
}

// lost drops the session after a failure: its keys are gone, and so is
// every group this gateway coordinated (their members find the new
// coordinator). l.mu is held.
func (l *leases) lost(ctx context.Context, err error) {
	if l.conn == nil {
		return
	}
	if ctx.Err() == nil {
		l.s.log.Warn().Err(err).Int("groups", len(l.owned)).Msg("kafka: lost the coordinator session; no longer coordinating its groups")
	}
	_ = l.conn.Conn().Close(context.WithoutCancel(ctx))
	l.conn.Release()
	l.conn = nil
	groups := l.owned
	l.owned = map[string]bool{}
	l.held = map[string]string{} // the holds went with the session
	l.s.groups.drop(groups)
}

// run keeps a registered coordinator session, checking it every
// leaseCheck, until ctx ends.
func (l *leases) run(ctx context.Context) error {
	defer func() {
		l.mu.Lock()
		if l.conn != nil {
			_ = l.conn.Conn().Close(context.WithoutCancel(ctx))
			l.conn.Release()
			l.conn = nil
		}
		l.mu.Unlock()
	}()
	t := time.NewTicker(leaseCheck)
	defer t.Stop()
	for {
		l.mu.Lock()
		if l.conn == nil {
			l.connect(ctx)
		} else if _, err := l.conn.Exec(ctx, "SELECT 1"); err != nil {
			l.lost(ctx, err)
		}
		l.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// connect opens and registers the session. l.mu is held.
func (l *leases) connect(ctx context.Context) {
	conn, err := l.s.pool.Acquire(ctx)
	if err != nil {
		return
	}
	name := sessionPrefix + strconv.Itoa(int(l.s.opts.NodeID))
	if _, err := conn.Exec(ctx, schema.SQL(ctx, registerSQL), l.s.opts.NodeID, l.s.host, l.s.port, name); err != nil {
		if ctx.Err() == nil && !strings.Contains(err.Error(), "context canceled") {
			l.s.log.Warn().Err(err).Msg("kafka: registering the gateway")
		}
		_ = conn.Conn().Close(context.WithoutCancel(ctx))
		conn.Release()
		return
	}
	l.conn = conn
}
