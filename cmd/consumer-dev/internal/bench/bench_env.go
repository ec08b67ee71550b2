package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/pgcluster"
	"github.com/pgevents/pgevents/schema"
)

// benchTopic is the topic every case appends to and consumes.
const benchTopic = 1

// benchDBPrefix starts the name of every database the bench creates.
const benchDBPrefix = "pgevents_bench_"

// benchEnv is what the cases share: the server, how long to run and how
// often to repeat, and where progress goes.
type benchEnv struct {
	quick    bool
	reps     int
	progress io.Writer
	started  time.Time
	header   benchHeader

	cluster   *pgcluster.Cluster     // nil when DATABASE_URL names the server
	serverPID int                    // the postmaster's pid when the bench started it
	dbURL     func(db string) string // the URL of database db on the server
	admin     *pgxpool.Pool          // on the server's maintenance database
	riverDir  string                 // the River program's module, when --river names it

	mu  sync.Mutex
	seq int
}

// openBenchEnv starts a throwaway PostgreSQL under dir (default durability
// settings) or connects to DATABASE_URL, and describes server and machine.
func openBenchEnv(ctx context.Context, dir string, quick bool, progress io.Writer) (*benchEnv, error) {
	e := &benchEnv{quick: quick, reps: 3, progress: progress, started: time.Now()}
	if quick {
		e.reps = 1
	}
	where := "DATABASE_URL"
	adminDB := ""
	if raw := os.Getenv("DATABASE_URL"); raw != "" {
		e.dbURL = func(db string) string { return benchURLWithDB(raw, db) }
	} else {
		// Searchable by all: when run as root, the server runs as postgres.
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		abs, err := filepath.Abs(filepath.Join(dir, "pg"))
		if err != nil {
			return nil, err
		}
		e.logf("starting PostgreSQL in %s ...", abs)
		// Commit timestamps let the latency case measure from the producer's
		// commit, on the database clock.
		settings := map[string]string{"track_commit_timestamp": "on"}
		maps.Copy(settings, benchStatementSettings)
		cl, err := pgcluster.Start(ctx, pgcluster.Options{Dir: abs, Settings: settings})
		if err != nil {
			return nil, err
		}
		e.cluster, e.dbURL, adminDB = cl, cl.URL, "postgres"
		if b, err := os.ReadFile(filepath.Join(cl.DataDir(), "postmaster.pid")); err == nil {
			first, _, _ := strings.Cut(string(b), "\n")
			e.serverPID, _ = strconv.Atoi(strings.TrimSpace(first))
		}
		where = "throwaway cluster in " + abs
	}
	adminURL := os.Getenv("DATABASE_URL")
	if adminDB != "" {
		adminURL = e.dbURL(adminDB)
	}
	pc, err := pgxpool.ParseConfig(adminURL)
	if err != nil {
		e.close()
		return nil, fmt.Errorf("bench: %w", err)
	}
	pc.MaxConns = 4
	if e.admin, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		e.close()
		return nil, fmt.Errorf("bench: connect: %w", err)
	}
	if e.cluster != nil {
		// Databases left behind by an interrupted run of this very cluster.
		e.dropDatabases(ctx, benchDBPrefix+"%")
		if _, err := e.admin.Exec(ctx, benchRolesSQL); err != nil {
			e.close()
			return nil, fmt.Errorf("bench: the consumers' and producers' roles: %w", err)
		}
	}
	if err := e.describe(ctx, where); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// describe fills in the header: mode, server version and settings, machine.
func (e *benchEnv) describe(ctx context.Context, where string) error {
	h := &e.header
	h.Mode, h.Repetitions, h.Where, h.Started = "full", e.reps, where, e.started
	if e.quick {
		h.Mode = "quick"
	}
	if err := e.admin.QueryRow(ctx, `SELECT 'PostgreSQL ' || current_setting('server_version')`).Scan(&h.Server); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	h.Settings = map[string]string{}
	for _, name := range benchSettingNames {
		var v string
		if err := e.admin.QueryRow(ctx, `SELECT current_setting($1)`, name).Scan(&v); err != nil {
			return fmt.Errorf("bench: setting %s: %w", name, err)
		}
		h.Settings[name] = v
	}
	h.CPUs, h.MemoryMiB = runtime.NumCPU(), benchMemTotalMiB()
	h.Go = runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
	return nil
}

// close disconnects and stops the throwaway server, if any.
func (e *benchEnv) close() {
	if e.admin != nil {
		e.admin.Close()
	}
	if e.cluster != nil {
		e.logf("stopping PostgreSQL ...")
		if err := e.cluster.Stop(); err != nil {
			e.logf("stop PostgreSQL: %v", err)
		}
	}
}

// logf prints a progress line to stderr, stamped with the elapsed time.
func (e *benchEnv) logf(format string, args ...any) {
	fmt.Fprintf(e.progress, "[%6.1fs] %s\n", time.Since(e.started).Seconds(), fmt.Sprintf(format, args...))
}

// dropDatabases drops the databases whose names match the LIKE pattern.
func (e *benchEnv) dropDatabases(ctx context.Context, like string) {
	rows, err := e.admin.Query(ctx, `SELECT datname FROM pg_database WHERE datname LIKE $1`, like)
	if err != nil {
		return
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return
	}
	for _, n := range names {
		_, _ = e.admin.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{n}.Sanitize()+` WITH (FORCE)`)
	}
}

// cpu reads the CPU times of the machine, this process and the server.
func (e *benchEnv) cpu() benchCPU { return readBenchCPU(e.serverPID) }

// benchServerActivity counts what the server did: checkpoints, WAL bytes
// and buffers written by backends themselves (not the background writer
// or checkpointer).
type benchServerActivity struct {
	Checkpoints   int64 `json:"checkpoints"`
	WALBytes      int64 `json:"wal_bytes"`
	BackendWrites int64 `json:"backend_buffer_writes"`
}

// serverActivity reads the server's counters; zero when they cannot be read.
func (e *benchEnv) serverActivity(ctx context.Context) benchServerActivity {
	var a benchServerActivity
	_ = e.admin.QueryRow(ctx, `SELECT checkpoints_timed + checkpoints_req, buffers_backend,
       pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint
FROM pg_stat_bgwriter`).Scan(&a.Checkpoints, &a.BackendWrites, &a.WALBytes)
	return a
}

// since returns the activity between start and a.
func (a benchServerActivity) since(start benchServerActivity) benchServerActivity {
	return benchServerActivity{Checkpoints: a.Checkpoints - start.Checkpoints, WALBytes: a.WALBytes - start.WALBytes,
		BackendWrites: a.BackendWrites - start.BackendWrites}
}

// benchPick returns full in full mode and quick with --quick.
func benchPick[T any](e *benchEnv, full, quick T) T {
	if e.quick {
		return quick
	}
	return full
}

// benchURLWithDB returns the connection string raw pointing at database db
// instead: the URL's path for a postgres:// URL, a dbname keyword otherwise.
func benchURLWithDB(raw, db string) string {
	if u, err := url.Parse(raw); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + db
		u.RawPath = ""
		return u.String()
	}
	return raw + " dbname=" + db
}

// benchDB is a fresh database with the schema migrated and the bench topic
// created. Close drops it.
type benchDB struct {
	env   *benchEnv
	name  string
	url   string
	pool  *pgxpool.Pool // a small pool for setup and monitoring
	pools []*pgxpool.Pool
}

// newDB creates a fresh database, migrates it with schema.Migrate and
// creates the bench topic with the given partition count, in the default
// mode.
func (e *benchEnv) newDB(ctx context.Context, partitions int) (*benchDB, error) {
	return e.newModeDB(ctx, partitions, benchDefaultMode)
}

// newModeDB is newDB with the bench topic in mode m (its topic is ignored).
func (e *benchEnv) newModeDB(ctx context.Context, partitions int, m benchProducerMode) (*benchDB, error) {
	d, err := e.newBareDB(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := schema.Migrate(ctx, d.pool); err != nil {
		d.close()
		return nil, err
	}
	if err := m.create(ctx, d.pool, benchTopic, partitions); err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

// newBareDB creates a fresh, empty database: no pgevents schema, for a
// peer's tables.
func (e *benchEnv) newBareDB(ctx context.Context) (*benchDB, error) {
	e.mu.Lock()
	e.seq++
	name := fmt.Sprintf("%s%d_%d", benchDBPrefix, os.Getpid(), e.seq)
	e.mu.Unlock()
	if _, err := e.admin.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	d := &benchDB{env: e, name: name, url: e.dbURL(name)}
	pool, err := d.openPool(ctx, "pgevents-bench", 4, nil)
	if err != nil {
		d.close()
		return nil, err
	}
	d.pool = pool
	return d, nil
}

// openPool opens a pool on the database with the server's default session
// settings (as a producer has them) and the given application_name (so that
// pg_stat_activity tells producers from consumers), size and session
// settings. The pool is closed by Close.
func (d *benchDB) openPool(ctx context.Context, app string, maxConns int, params map[string]string) (*pgxpool.Pool, error) {
	return d.openPoolAs(ctx, d.url, app, maxConns, params)
}

// openPoolAs is openPool on the connection string u (roleURL: as a role
// of the bench's).
func (d *benchDB) openPoolAs(ctx context.Context, u, app string, maxConns int, params map[string]string) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, err
	}
	return d.newPool(ctx, pc, app, maxConns, params)
}

// newPool opens a pool from pc, as openPool describes.
func (d *benchDB) newPool(ctx context.Context, pc *pgxpool.Config, app string, maxConns int, params map[string]string) (*pgxpool.Pool, error) {
	pc.ConnConfig.RuntimeParams["application_name"] = app
	for k, v := range params {
		pc.ConnConfig.RuntimeParams[k] = v
	}
	pc.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", d.name, err)
	}
	d.pools = append(d.pools, pool)
	return pool, nil
}

// benchProducerSetup is a configuration of the producers' connections: the
// server's defaults, or a what-if that the report labels as such.
// (Consumers always have pgevents' own settings, pgevents.ParsePoolConfig.)
type benchProducerSetup struct {
	label    string            // "" for the defaults
	producer map[string]string // session settings of the producers' connections
}

// benchAsyncProducers is the what-if of producers whose commits do not wait
// for the WAL flush (synchronous_commit off): what a disk with fast flushes
// (or a team that accepts losing the last milliseconds of commits in a
// crash) gives. The counter row's lock is held until the flush, so on a
// disk with slow flushes it bounds single-event appends and latency.
var benchAsyncProducers = benchProducerSetup{
	label:    "what-if: producers synchronous_commit=off",
	producer: map[string]string{"synchronous_commit": "off"},
}

// name returns s labelled with the variant.
func (v benchProducerSetup) name(s string) string {
	if v.label == "" {
		return s
	}
	return s + " (" + v.label + ")"
}

// openConsumerPool opens the pool of an in-process consumer serving the
// given number of partitions, configured as pgevents configures it.
func (d *benchDB) openConsumerPool(ctx context.Context, partitions int) (*pgxpool.Pool, error) {
	pc, err := pgevents.ParsePoolConfig(d.consumerURL())
	if err != nil {
		return nil, err
	}
	return d.newPool(ctx, pc, "pgevents-consumer", pgevents.PoolSize(partitions), nil)
}

// close closes the database's pools and drops it.
func (d *benchDB) close() {
	for _, p := range d.pools {
		p.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := d.env.admin.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{d.name}.Sanitize()+` WITH (FORCE)`); err != nil {
		d.env.logf("drop database %s: %v", d.name, err)
	}
}

// exec runs statements on the database.
func (d *benchDB) exec(ctx context.Context, sql string, args ...any) error {
	if _, err := d.pool.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("%s: %w", strings.Join(strings.Fields(sql), " "), err)
	}
	return nil
}

// ensureSegments creates the log segments the counter will reach next, as
// an operator's maintenance job would; call it between measurements.
func (d *benchDB) ensureSegments(ctx context.Context) error {
	_, err := schema.EnsureSegments(ctx, d.pool, benchTopic)
	return err
}

// benchWait polls cond every few milliseconds until it returns true or an
// error, or until timeout, when it fails naming what it waited for.
func benchWait(ctx context.Context, timeout time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil {
			return fmt.Errorf("waiting for %s: %w", what, err)
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s", what, timeout)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}
