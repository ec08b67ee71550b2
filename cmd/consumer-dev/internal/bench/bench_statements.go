package bench

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
)

// What each side runs per event, from pg_stat_statements.
//
// The bench's throwaway cluster loads pg_stat_statements, tracking nothing
// by default (its hooks then return at once: the other cases, and the
// peers the bench compares pgevents with, do not pay for it). A case that
// counts statements turns tracking on for its own database (countStatements:
// track = all, so that statements run inside PL/pgSQL functions, append
// _event's, the claim's, are counted beside the statements clients send),
// before its sessions connect. Consumers, in process and as `consumer run`
// processes, connect as benchConsumerRole, producers as benchProducerRole,
// the bench itself as the cluster's owner: the role tells one side's
// statements from the other's. The case resets the counters before its
// window (pg_stat_statements_reset, for the whole cluster: the cases run
// one at a time) and reads them after it.

// The roles consumers and the producers of the cases that count
// statements connect as.
const (
	benchConsumerRole = "bench_consumer"
	benchProducerRole = "bench_producer"
)

// benchStatementSettings load pg_stat_statements in the throwaway cluster.
var benchStatementSettings = map[string]string{
	"shared_preload_libraries":         "pg_stat_statements",
	"pg_stat_statements.track":         "none",
	"pg_stat_statements.max":           "10000",
	"pg_stat_statements.track_utility": "on",
}

const (
	// benchRolesSQL creates the consumers' and producers' roles:
	// superusers, as the cluster's owner is (consumers end a stale owner's
	// batch and a frozen holder's session, which takes the rights of the
	// session's role).
	benchRolesSQL = `DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '` + benchConsumerRole + `') THEN
        CREATE ROLE ` + benchConsumerRole + ` LOGIN SUPERUSER;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '` + benchProducerRole + `') THEN
        CREATE ROLE ` + benchProducerRole + ` LOGIN SUPERUSER;
    END IF;
END $$`

	// benchStatementsSQL sums, for the database's statements of role $1,
	// the calls made by clients (toplevel) and all calls (with those inside
	// functions), and lists the statements by calls (nested ones marked),
	// with their mean execution time in microseconds.
	benchStatementsSQL = `SELECT s.toplevel, s.calls, s.mean_exec_time * 1000, left(regexp_replace(s.query, '\s+', ' ', 'g'), 120)
FROM pg_stat_statements s
JOIN pg_roles r ON r.oid = s.userid
JOIN pg_database d ON d.oid = s.dbid
WHERE r.rolname = $1 AND d.datname = current_database() AND s.calls > 0
ORDER BY s.calls DESC`
)

// benchStatements is what one role ran in a window: client statements (and
// all, nested included) per event, and the statements by calls.
type benchStatements struct {
	top, all float64 // per event
	lines    []string
}

// countStatements makes pg_stat_statements count every statement run on the
// database (track = all) by the sessions that connect from now on.
func (d *benchDB) countStatements(ctx context.Context) error {
	if d.env.cluster == nil {
		return nil // a server of the user's: its settings stay
	}
	_, err := d.env.admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{d.name}.Sanitize()+` SET pg_stat_statements.track = 'all'`)
	return err
}

// resetStatements zeroes pg_stat_statements' counters; false when the
// server does not have it (a DATABASE_URL server without the library).
func (d *benchDB) resetStatements(ctx context.Context) bool {
	if _, err := d.pool.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return false
	}
	_, err := d.pool.Exec(ctx, `SELECT pg_stat_statements_reset()`)
	return err == nil
}

// statements reads what role ran on the database since the last reset,
// per event of events: each statement's calls, mean time and time (the
// mean by the calls) per event.
func (d *benchDB) statements(ctx context.Context, role string, events int64) (benchStatements, error) {
	var out benchStatements
	if events <= 0 {
		return out, nil
	}
	rows, err := d.pool.Query(ctx, benchStatementsSQL, role)
	if err != nil {
		return out, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			top   bool
			calls int64
			us    float64
			query string
		)
		if err := rows.Scan(&top, &calls, &us, &query); err != nil {
			return out, err
		}
		per := float64(calls) / float64(events)
		out.all += per
		where := "  nested"
		if top {
			out.top += per
			where = "  client"
		}
		if len(out.lines) < benchStatementLines {
			out.lines = append(out.lines, fmt.Sprintf("%s %6.3f/event %8.1f µs %8.1f µs/event  %s", where, per, us, per*us, query))
		}
	}
	return out, rows.Err()
}

// benchStatementLines is how many statements a listing shows, the most
// called first.
const benchStatementLines = 24

// log prints s under a title.
func (s benchStatements) log(e *benchEnv, title string) {
	e.logf("%s: %.2f client statements per event (%.2f with those inside functions); by calls:", title, s.top, s.all)
	for _, l := range s.lines {
		e.logf("%s", l)
	}
}

// consumerURL is the database's URL for consumers (roleURL).
func (d *benchDB) consumerURL() string { return d.roleURL(benchConsumerRole) }

// roleURL is the database's URL as role when the bench started the server
// (DATABASE_URL's own user otherwise: statements are then not told apart).
func (d *benchDB) roleURL(role string) string {
	if d.env.cluster == nil {
		return d.url
	}
	if u, err := url.Parse(d.url); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.User = url.User(role)
		return u.String()
	}
	return strings.TrimSpace(d.url) + " user=" + role
}
