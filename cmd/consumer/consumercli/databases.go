package consumercli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

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
// pool of size connections, and returns a context naming p's schema.
func (p place) open(ctx context.Context, cfg *config.Config, size int, path string) (context.Context, *pgxpool.Pool, error) {
	pool, err := openPoolOn(ctx, cfg, p.url, p.key, size, path)
	if err != nil {
		return ctx, nil, err
	}
	return schema.WithName(ctx, p.schema), pool, nil
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
// (config.Config.Databases), each sized for the groups on it, and returns
// each group's pool, in GroupConfigs order, and a function that closes
// them all.
func openPools(ctx context.Context, cfg *config.Config, path string) ([]*pgxpool.Pool, func(), error) {
	pools := make([]*pgxpool.Pool, len(cfg.GroupConfigs()))
	var opened []*pgxpool.Pool
	closeAll := func() {
		for _, p := range opened {
			p.Close()
		}
	}
	for _, d := range cfg.Databases() {
		pool, err := openPoolOn(ctx, cfg, d.URL, d.Key, d.PoolSize, path)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		opened = append(opened, pool)
		for _, i := range d.Groups {
			pools[i] = pool
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
// the file's session timeouts and a pool of size connections.
func openPoolOn(ctx context.Context, cfg *config.Config, url, key string, size int, path string) (*pgxpool.Pool, error) {
	pc, err := pgevents.NewPoolConfig(url, cfg.PoolOptions())
	if err != nil {
		return nil, &config.Error{File: path, Key: key, Msg: err.Error()}
	}
	pc.MaxConns = int32(size)
	prefix := "connect"
	if key != "databaseUrl" {
		prefix += " " + key
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(cctx, pc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", prefix, err)
	}
	if err := pool.Ping(cctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%s: %w", prefix, err)
	}
	return pool, nil
}

// dbLabel names the database of pool as user@host:port/database, never
// with its password.
func dbLabel(pool *pgxpool.Pool) string {
	cc := pool.Config().ConnConfig
	return fmt.Sprintf("%s@%s:%d/%s", cc.User, cc.Host, cc.Port, cc.Database)
}
