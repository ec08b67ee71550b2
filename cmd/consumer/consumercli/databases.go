package consumercli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/schema"
)

// This file: where each command finds pgevents when the file's groups run
// on several databases (groups[i].databaseUrl, groups[i].schema). `run`
// opens a pool per database, sized for the groups on it; the commands
// that name a group (--group) use that group's database and schema; the
// others use the top level's.

// place is an installation of pgevents, and a topic in it: a database
// (its URL and the file's key that sets it), a schema and a topic.
type place struct {
	url    string
	key    string // databaseUrl, or groups[i].databaseUrl
	schema string
	topic  int
	// groups are the indexes (GroupConfigs order) of the file's groups
	// there; none for the top level's place of a file whose groups all
	// run elsewhere.
	groups []int
}

// topPlace is the place of the commands that name no group: the top
// level's database, schema and topic.
func topPlace(cfg *config.Config) place {
	return place{url: cfg.DatabaseURL, key: "databaseUrl", schema: cfg.Schema, topic: cfg.TopicID}
}

// groupPlaces returns the places of the file's groups, each (database,
// schema, topic) once, in the order of their first group.
func groupPlaces(cfg *config.Config) []place {
	var out []place
	for i, g := range cfg.GroupConfigs() {
		j := slices.IndexFunc(out, func(p place) bool {
			return p.url == g.DatabaseURL && p.schema == g.Schema && p.topic == g.TopicID
		})
		if j < 0 {
			out = append(out, place{url: g.DatabaseURL, key: cfg.KeyPath(i, "databaseUrl"), schema: g.Schema, topic: g.TopicID})
			j = len(out) - 1
		}
		out[j].groups = append(out[j].groups, i)
	}
	return out
}

// groupPlace returns where the commands that name group find it: the
// database and schema of the file's groups items of that name (and topic,
// when not 0), with their topic when topic is 0 and they have one; or the
// top level's place when the file does not list the group (a group run
// from another file). A group listed on several databases or schemas is
// refused unless topic tells them apart.
func groupPlace(cfg *config.Config, group string, topic int) (place, error) {
	top := topPlace(cfg)
	if topic != 0 {
		top.topic = topic
	}
	if group == "" {
		return top, nil
	}
	var found []place
	for _, p := range groupPlaces(cfg) {
		for _, i := range p.groups {
			if g := cfg.GroupConfigs()[i]; g.GroupID == group && (topic == 0 || g.TopicID == topic) {
				q := p
				q.groups = []int{i}
				found = append(found, q)
			}
		}
	}
	switch {
	case len(found) == 0:
		return top, nil
	case len(found) == 1:
		return found[0], nil
	}
	for _, p := range found[1:] {
		if p.url != found[0].url || p.schema != found[0].schema {
			var keys []string
			for _, q := range found {
				keys = append(keys, fmt.Sprintf("groups[%d]", q.groups[0]))
			}
			return place{}, usagef("group %q is listed on several databases or schemas (%s): name its topic with --topic", group, strings.Join(keys, ", "))
		}
	}
	// One installation, several topics: the top level's topic, as for a
	// group the file does not list.
	p := found[0]
	p.topic = top.topic
	return p, nil
}

// open connects to p's database with the file's session timeouts and a
// pool of size connections, checks that pgevents is installed in p's
// schema there (see installed), and returns a context naming p's schema.
func (p place) open(ctx context.Context, cfg *config.Config, size int, path string) (context.Context, *pgxpool.Pool, error) {
	ctx, pool, err := p.openRaw(ctx, cfg, size, path)
	if err != nil {
		return ctx, nil, err
	}
	if err := installed(ctx, pool, p.schemaKey(cfg), path); err != nil {
		pool.Close()
		return ctx, nil, err
	}
	return ctx, pool, nil
}

// openRaw is open without the check that pgevents is installed: for the
// commands that install it (adopt).
func (p place) openRaw(ctx context.Context, cfg *config.Config, size int, path string) (context.Context, *pgxpool.Pool, error) {
	pool, err := openPoolOn(ctx, cfg, p.url, p.key, size, path)
	if err != nil {
		return ctx, nil, err
	}
	return schema.WithName(ctx, p.schema), pool, nil
}

// schemaKey is the file's key that sets p's schema.
func (p place) schemaKey(cfg *config.Config) string {
	if len(p.groups) > 0 {
		return cfg.KeyPath(p.groups[0], "schema")
	}
	return "schema"
}

// installed returns nil when pgevents is installed in the schema ctx
// names on db (schema.Version is not 0), or an error that says so and
// what to do: run `consumer migrate`, or correct the file's schema key
// (schemaKey), which a message naming a missing log_counter would leave
// the operator to guess.
func installed(ctx context.Context, db *pgxpool.Pool, schemaKey, path string) error {
	v, err := schema.Version(ctx, db)
	if err != nil || v > 0 {
		return err
	}
	name := schema.Name(ctx)
	migrate := fmt.Sprintf("`%s migrate --config %s`", cmdName(ctx), path)
	where := dbLabel(db)
	if name == "" {
		var first string
		_ = db.QueryRow(ctx, `SELECT coalesce(current_schema(), '(none)')`).Scan(&first)
		return fmt.Errorf("pgevents is not installed in database %s (in the first schema of its search_path, %s): run %s first; if pgevents lives in a schema of its own, name it with the %s key",
			where, first, migrate, schemaKey)
	}
	var exists bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)`, name).Scan(&exists); err != nil {
		return err
	}
	if !exists {
		return fmt.Errorf("schema %q (the file's %s key) does not exist in database %s: correct the key, or run %s to install pgevents there",
			name, schemaKey, where, migrate)
	}
	return fmt.Errorf("pgevents is not installed in schema %q (the file's %s key) of database %s: run %s first, or correct the key",
		name, schemaKey, where, migrate)
}

// connectGroup loads the configuration file at path and opens a pool on
// the database of group (see groupPlace: the top level's when group is
// empty or not in the file). When topic points to 0, it is set to the
// group's topicId, or the top level's. The context it returns names the
// group's schema.
func connectGroup(ctx context.Context, path, group string, topic *int) (context.Context, *config.Config, *pgxpool.Pool, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return ctx, nil, nil, err
	}
	t := 0
	if topic != nil {
		t = *topic
	}
	p, err := groupPlace(cfg, group, t)
	if err != nil {
		return ctx, nil, nil, err
	}
	if topic != nil && *topic == 0 {
		*topic = p.topic
	}
	ctx, pool, err := p.open(ctx, cfg, cfg.PoolSize(), path)
	if err != nil {
		return ctx, nil, nil, err
	}
	return ctx, cfg, pool, nil
}

// openPools opens a pool per database of the file's groups
// (config.Config.Databases), each sized for the groups on it, checks that
// pgevents is installed in each group's schema there, and returns each
// group's pool, in GroupConfigs order, and a function that closes them
// all.
func openPools(ctx context.Context, cfg *config.Config, path string) ([]*pgxpool.Pool, func(), error) {
	pools := make([]*pgxpool.Pool, len(cfg.GroupConfigs()))
	var opened []*pgxpool.Pool
	closeAll := func() {
		for _, p := range opened {
			p.Close()
		}
	}
	groups := cfg.GroupConfigs()
	for _, d := range cfg.Databases() {
		pool, err := openPoolOn(ctx, cfg, d.URL, d.Key, d.PoolSize, path)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		opened = append(opened, pool)
		var checked []string
		for _, i := range d.Groups {
			pools[i] = pool
			if slices.Contains(checked, groups[i].Schema) {
				continue
			}
			checked = append(checked, groups[i].Schema)
			if err := installed(schema.WithName(ctx, groups[i].Schema), pool, cfg.KeyPath(i, "schema"), path); err != nil {
				closeAll()
				return nil, nil, err
			}
		}
	}
	return pools, closeAll, nil
}

// distinctPools returns pools without repeats, in order.
func distinctPools(pools []*pgxpool.Pool) []*pgxpool.Pool {
	var out []*pgxpool.Pool
	for _, p := range pools {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// openPoolOn connects to the database at url (set by the file's key) with
// the file's session timeouts and a pool of size connections. A failure
// to connect is one line (see connectError).
func openPoolOn(ctx context.Context, cfg *config.Config, url, key string, size int, path string) (*pgxpool.Pool, error) {
	pc, err := pgevents.NewPoolConfig(url, cfg.PoolOptions())
	if err != nil {
		return nil, &config.Error{File: path, Key: key, Msg: err.Error()}
	}
	pc.MaxConns = int32(size)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(cctx, pc)
	if err != nil {
		return nil, connectError(err, pc.ConnConfig, key, path)
	}
	if err := pool.Ping(cctx); err != nil {
		pool.Close()
		return nil, connectError(err, pc.ConnConfig, key, path)
	}
	return pool, nil
}

// connectError is the error of a failure to connect to the database cc
// describes, whose URL the file's key set (or DATABASE_URL, which
// overrides the top level's databaseUrl): one line that names the database
// without its password, where its URL came from, and why the connection
// failed, once. pgx's own error lists each attempt (an address, then the
// same again without TLS under sslmode=prefer), the TLS attempt's error
// first, though the reason is the same.
func connectError(err error, cc *pgx.ConnConfig, key, path string) error {
	from := "from " + key
	if path != "" {
		from += " in " + path
	}
	if key == "databaseUrl" && os.Getenv("DATABASE_URL") != "" {
		from = "from DATABASE_URL"
	}
	return &connectFailure{
		msg: fmt.Sprintf("cannot connect to database %s@%s:%d/%s (URL %s): %s",
			cc.User, cc.Host, cc.Port, cc.Database, from, connectCause(err)),
		err: err,
	}
}

// connectFailure is a failure to connect, said in one line; it wraps
// pgx's error.
type connectFailure struct {
	msg string
	err error
}

func (e *connectFailure) Error() string { return e.msg }
func (e *connectFailure) Unwrap() error { return e.err }

// connectCause returns why a connection failed, once: of each attempt
// pgx made, the server's error, the network's, or the attempt's own
// message, without repeats, the TLS attempts' left out when another
// attempt says more.
func connectCause(err error) string {
	if errors.Is(err, context.DeadlineExceeded) {
		return "no answer within 30s"
	}
	var attempts []error
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		inner := ce.Unwrap()
		if j, ok := inner.(interface{ Unwrap() []error }); ok {
			attempts = j.Unwrap()
		} else if inner != nil {
			attempts = []error{inner}
		}
	}
	if len(attempts) == 0 {
		attempts = []error{err}
	}
	var causes, tlsCauses []string
	for _, a := range attempts {
		msg := a.Error()
		var pgErr *pgconn.PgError
		var opErr *net.OpError
		var dnsErr *net.DNSError
		switch {
		case errors.As(a, &pgErr):
			msg = pgErr.Severity + ": " + pgErr.Message + " (SQLSTATE " + pgErr.Code + ")"
		case errors.As(a, &dnsErr):
			msg = dnsErr.Error()
		case errors.As(a, &opErr):
			msg = opErr.Error()
		}
		if strings.Contains(strings.ToLower(a.Error()), "tls") && pgErr == nil {
			if !slices.Contains(tlsCauses, msg) {
				tlsCauses = append(tlsCauses, msg)
			}
			continue
		}
		if !slices.Contains(causes, msg) {
			causes = append(causes, msg)
		}
	}
	if len(causes) == 0 {
		causes = tlsCauses
	}
	return strings.Join(causes, "; ")
}

// dbLabel names the database of pool as user@host:port/database, never
// with its password.
func dbLabel(pool *pgxpool.Pool) string {
	cc := pool.Config().ConnConfig
	return fmt.Sprintf("%s@%s:%d/%s", cc.User, cc.Host, cc.Port, cc.Database)
}
