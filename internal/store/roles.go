package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgevents/pgevents/schema"
)

// A topic's leased roles: the elected watcher (wake.go), the sequencer of a
// sequenced topic (sequencer.go) and maintenance. Each is held by one
// session per topic and database (and installation) at a time, the one
// holding the role's key: a session advisory lock, lock_key(<key>,
// <topic>), which goes with the session when its process exits, is killed
// or loses its connection.
//
// A frozen process (SIGSTOP, a paused VM, a cut network) keeps its
// sessions, and with them the keys, while nothing it holds makes progress.
// So a process that wants a role and finds its key held looks at the
// holder (EndFrozenHolder): a holder's session names its process in its
// application_name ("pgevents <role> <replica>"); it is frozen when no
// replica of the topic with that id has a live heartbeat (consumer_replicas,
// renewed every fraction of the lease, on the database clock) and the
// session has run no statement for the grace given. Then its session is
// ended, and the key goes to a waiter. The two conditions cover every
// holder: a consumer's role (its replica heartbeats; a watcher asleep on
// every partition runs no statement for as long as the topic is idle) and
// `consumer maintain`'s, which is no replica (its sequencer runs a
// statement every second, idle or not; maintenance holds its key only
// while its pass runs statements).
//
// Ending a session is safe for every role: whatever the session had not
// committed rolls back (a tick, a maintenance step), what it committed
// stays, and the process, when it thaws, finds its connection gone and
// waits for the key again.
const (
	// roleHolderSQL names the session that holds role $2's key of topic $1
	// (its pid and application_name), says whether that session has run
	// no statement for $3 ms (it is not active, and its state last changed
	// before; without state tracking, it connected before), and lists the
	// replicas of the topic whose heartbeat is live. No row: nobody holds
	// the key, or this session does.
	//
	// A session of another role shows NULL state and application_name
	// unless this role has pg_read_all_stats: it is then never taken for
	// frozen (coalesce), and could not be ended anyway.
	roleHolderSQL = `SELECT a.pid, coalesce(a.application_name, ''),
       coalesce(a.state IS DISTINCT FROM 'active'
         AND CASE WHEN a.state LIKE 'idle%' THEN a.state_change ELSE a.backend_start END
             < clock_timestamp() - $3 * interval '1 millisecond', false),
       ARRAY(SELECT r.replica_id FROM {schema}consumer_replicas r
              WHERE r.topic_id = $1 AND r.expires_at > clock_timestamp())
FROM (SELECT {schema}lock_key($2, $1::integer::text) AS key) k
JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((k.key >> 32) & 4294967295)::oid AND l.objid = (k.key & 4294967295)::oid
JOIN pg_stat_activity a ON a.pid = l.pid
WHERE a.pid <> pg_backend_pid()`

	// roleSessionsSQL names the session that holds role $2's key of topic
	// $1 (NULL: none), and counts the sessions waiting for it.
	roleSessionsSQL = roleSessionsHead + `$2, $1` + roleSessionsTail

	// SequencerSessionsSQL is roleSessionsSQL of the sequencer of topic $2,
	// for the status statements, as a query of one row (holder, waiting);
	// it reads no lock unless the topic is sequenced.
	SequencerSessionsSQL = roleSessionsHead + `'sequencer', $2` + roleSessionsTail + `
WHERE EXISTS (SELECT 1 FROM {schema}sequencer_ticks q WHERE q.topic_id = $2)`

	roleSessionsHead = `SELECT max(a.application_name) FILTER (WHERE l.granted) AS holder, count(*) FILTER (WHERE NOT l.granted) AS waiting
FROM (SELECT {schema}lock_key(`
	roleSessionsTail = `::integer::text) AS key) k
JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((k.key >> 32) & 4294967295)::oid AND l.objid = (k.key & 4294967295)::oid
LEFT JOIN pg_stat_activity a ON a.pid = l.pid`

	// endHolderSQL ends the session $1 if it is still the one named $2.
	endHolderSQL = `SELECT count(pg_terminate_backend(a.pid)) FROM pg_stat_activity a
WHERE a.pid = $1 AND a.application_name = $2`

	// tryRoleSQL takes role $2's key of topic $1 for the session if no
	// other session holds it.
	tryRoleSQL = `SELECT pg_try_advisory_lock({schema}lock_key($2, $1::integer::text))`

	// waitRoleSQL waits until the session holds role $2's key of topic $1,
	// or for $3 ms (then it fails with SQLSTATE 55P03, lock_not_available):
	// the lock_timeout is the statement's (the materialized CTE sets it
	// before the wait; it goes back to the session's at the statement's
	// end), so the session's own statements keep theirs.
	waitRoleSQL = `WITH t AS MATERIALIZED (SELECT set_config('lock_timeout', $3::bigint || 'ms', true))
SELECT pg_advisory_lock({schema}lock_key($2, $1::integer::text)) FROM t`

	// releaseRoleSQL gives role $2's key of topic $1 back.
	releaseRoleSQL = `SELECT pg_advisory_unlock({schema}lock_key($2, $1::integer::text))`
)

// Role is a leased role of a topic: the kind of key its holder holds and
// the name its holder's session goes by.
type Role struct {
	key  string // lock_key's purpose
	name string // the word of the holder's application_name
}

// The leased roles.
var (
	// RoleWatcher is the elected watcher of a topic (wake.go).
	RoleWatcher = Role{key: "watch", name: "watcher"}
	// RoleSequencer is the sequencer of a sequenced topic (sequencer.go).
	RoleSequencer = Role{key: "sequencer", name: "sequencer"}
	// RoleMaintenance is the topic's maintenance pass.
	RoleMaintenance = Role{key: "maintenance", name: "maintenance"}
)

// String returns the role's name: watcher, sequencer, maintenance.
func (r Role) String() string { return r.name }

// ApplicationName returns the application_name of a session that holds
// (or waits for) the role for holder, a replica id or another process's
// name ("maintain"): printable ASCII, at most the 63 bytes the server
// keeps.
func (r Role) ApplicationName(holder string) string {
	return applicationName(r.Prefix() + holder)
}

// Prefix begins every ApplicationName of the role.
func (r Role) Prefix() string { return "pgevents " + r.name + " " }

// TryRole takes role's key of topic for db's session if no other session
// holds it, and reports whether it did.
func TryRole(ctx context.Context, db schema.DB, role Role, topic int) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, schema.SQL(ctx, tryRoleSQL), topic, role.key).Scan(&ok); err != nil {
		return false, fmt.Errorf("%s key of topic %d: %w", role, topic, err)
	}
	return ok, nil
}

// WaitRole waits, for at most wait, until db's session holds role's key of
// topic, and reports whether it does.
func WaitRole(ctx context.Context, db schema.DB, role Role, topic int, wait time.Duration) (bool, error) {
	_, err := db.Exec(ctx, schema.SQL(ctx, waitRoleSQL), topic, role.key, max(wait.Milliseconds(), 1))
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("wait for the %s key of topic %d: %w", role, topic, err)
	}
	return true, nil
}

// ReleaseRole gives role's key of topic back, on the session that holds
// it.
func ReleaseRole(ctx context.Context, db schema.DB, role Role, topic int) error {
	if _, err := db.Exec(ctx, schema.SQL(ctx, releaseRoleSQL), topic, role.key); err != nil {
		return fmt.Errorf("release the %s key of topic %d: %w", role, topic, err)
	}
	return nil
}

// EndFrozenHolder ends the session that holds role's key of topic when it
// is frozen: it is a session of the role (its application_name begins
// with role.Prefix()), no replica of the topic that it names has a live
// heartbeat, and it has run no statement for grace. It returns the ended
// session's application_name; "" when it ended nothing.
func EndFrozenHolder(ctx context.Context, db schema.DB, role Role, topic int, grace time.Duration) (string, error) {
	var (
		pid  int
		app  string
		idle bool
		live []string
	)
	err := db.QueryRow(ctx, schema.SQL(ctx, roleHolderSQL), topic, role.key, grace.Milliseconds()).Scan(&pid, &app, &idle, &live)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil // released meanwhile
	}
	if err != nil {
		return "", fmt.Errorf("the holder of the %s key of topic %d: %w", role, topic, err)
	}
	if !strings.HasPrefix(app, role.Prefix()) || !idle {
		return "", nil
	}
	for _, r := range live {
		if role.ApplicationName(r) == app {
			return "", nil
		}
	}
	var n int
	if err := db.QueryRow(ctx, endHolderSQL, pid, app).Scan(&n); err != nil {
		return "", fmt.Errorf("end the session of the %s of topic %d: %w", role, topic, err)
	}
	if n == 0 {
		return "", nil
	}
	return app, nil
}

// RoleSessions returns the application_name of the session that holds
// role's key of topic ("" when none does) and the number of sessions
// waiting for it.
func RoleSessions(ctx context.Context, db schema.DB, role Role, topic int) (string, int, error) {
	var holder *string
	var waiting int
	if err := db.QueryRow(ctx, schema.SQL(ctx, roleSessionsSQL), topic, role.key).Scan(&holder, &waiting); err != nil {
		return "", 0, fmt.Errorf("the %s of topic %d: %w", role, topic, err)
	}
	if holder == nil {
		return "", waiting, nil
	}
	return *holder, waiting, nil
}
