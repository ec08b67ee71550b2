package schema

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// The schema pgevents lives in.
//
// Every object pgevents creates can live in a schema of its own, so that it
// installs beside an application's tables of the same names (a seed-style
// deployment has log_counter, outbox_message_t, consumer_offsets,
// dead_letter_queue and notify_event()). The schema is chosen per context:
// WithName puts it in a context, and every statement pgevents runs with
// that context names pgevents' objects in it, qualified. Without a name,
// statements name the objects unqualified and the session's search_path
// finds them, as before schemas existed: then pgevents lives in the first
// schema of the search_path.
//
// Qualifying every name, rather than setting search_path on pgevents'
// connections, is what keeps handlers right: a handler runs the
// application's SQL in the consumer's transaction, on pgevents' connection,
// and its unqualified names must resolve as the application expects (to
// its own dead_letter_queue, say, not to pgevents'). The SQL functions
// resolve names for themselves: Migrate pins the search_path of every
// PL/pgSQL function to the schema (SET search_path), and the SQL-language
// ones bind their names when they are created, so append_event works when
// called schema-qualified from a session whose search_path does not
// include the schema.

// Marker is written before the name of every pgevents object in the
// statements of pgevents' packages, as in
//
//	SELECT next_offset FROM {schema}consumer_offsets WHERE ...
//
// SQL replaces it with the quoted schema and a dot, or with nothing. It is
// not valid SQL: a statement that reaches the server without going through
// SQL fails at once, whatever the schema, instead of finding another table
// of the same name.
const Marker = "{schema}"

type nameKey struct{}

// WithName returns a context whose statements name pgevents' objects in
// schema name; "" means the first schema of the search_path (unqualified
// names). name must satisfy ValidName.
func WithName(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, nameKey{}, name)
}

// Name returns the schema set on ctx by WithName, or "".
func Name(ctx context.Context) string {
	n, _ := ctx.Value(nameKey{}).(string)
	return n
}

// MaxIdentifierLength is the longest identifier PostgreSQL keeps: it
// truncates longer names (NAMEDATALEN - 1 bytes).
const MaxIdentifierLength = 63

// ValidIdentifier reports why s cannot be written unquoted as a PostgreSQL
// identifier (pgevents' schema, a topic's LISTEN channel) and still mean
// exactly s, or nil: it must match [a-z_][a-z0-9_]*, be at most
// MaxIdentifierLength bytes long (the server truncates longer names), and
// not be a reserved key word. It is the one rule for identifiers: the YAML
// configuration and pgevents.Config both check with it.
func ValidIdentifier(s string) error {
	if s == "" || len(s) > MaxIdentifierLength {
		return fmt.Errorf("%q must be a lowercase identifier of 1 to %d bytes", s, MaxIdentifierLength)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9' {
			continue
		}
		return fmt.Errorf("%q must be a lowercase identifier ([a-z_][a-z0-9_]*)", s)
	}
	if _, reserved := reservedWords[s]; reserved {
		return fmt.Errorf("%q is a reserved key word, which is not an identifier unquoted", s)
	}
	return nil
}

// ValidName reports why name cannot be pgevents' schema, or nil: it must
// be a valid identifier (ValidIdentifier) not starting with pg_ (reserved
// for the system).
func ValidName(name string) error {
	if err := ValidIdentifier(name); err != nil {
		return fmt.Errorf("schema name %w", err)
	}
	if strings.HasPrefix(name, "pg_") {
		return fmt.Errorf("schema name %q: names starting with pg_ are reserved for the system", name)
	}
	return nil
}

// reservedWords holds the PostgreSQL key words that cannot be used as an
// unquoted identifier: the "reserved" and "reserved (can be function or
// type)" categories of the key word table.
var reservedWords = func() map[string]struct{} {
	words := strings.Fields(`
		all analyse analyze and any array as asc asymmetric authorization
		binary both case cast check collate collation column concurrently
		constraint create cross current_catalog current_date current_role
		current_schema current_time current_timestamp current_user default
		deferrable desc distinct do else end except false fetch for foreign
		freeze from full grant group having ilike in initially inner
		intersect into is isnull join lateral leading left like limit
		localtime localtimestamp natural not notnull null offset on only or
		order outer overlaps placing primary references returning right
		select session_user similar some symmetric system_user table
		tablesample then to trailing true union unique user using variadic
		verbose when where window with`)
	m := make(map[string]struct{}, len(words))
	for _, w := range words {
		m[w] = struct{}{}
	}
	return m
}()

// SQL returns sql with every Marker replaced by the schema of ctx, quoted
// and followed by a dot, or removed when ctx names none. Results are
// cached: the statements of a consumer's hot path cost a map lookup.
func SQL(ctx context.Context, sql string) string {
	return Qualify(Name(ctx), sql)
}

// Qualify is SQL for schema name.
func Qualify(name, sql string) string {
	c := cacheOf(name)
	if q, ok := c.m.Load(sql); ok {
		return q.(string)
	}
	prefix := ""
	if name != "" {
		prefix = pgx.Identifier{name}.Sanitize() + "."
	}
	q := strings.ReplaceAll(sql, Marker, prefix)
	// Statements built at run time (with a partition's table in them, say)
	// are cached too, up to a bound that no real deployment reaches.
	if c.n.Load() < maxCached {
		if _, loaded := c.m.LoadOrStore(sql, q); !loaded {
			c.n.Add(1)
		}
	}
	return q
}

// Ident returns the name of pgevents' object obj, quoted and qualified with
// the schema of ctx when it names one, for statements built at run time.
func Ident(ctx context.Context, obj string) string {
	if n := Name(ctx); n != "" {
		return pgx.Identifier{n, obj}.Sanitize()
	}
	return pgx.Identifier{obj}.Sanitize()
}

const maxCached = 10000

type sqlCache struct {
	m sync.Map // statement → qualified statement
	n atomic.Int64
}

var caches sync.Map // schema name → *sqlCache

func cacheOf(name string) *sqlCache {
	if c, ok := caches.Load(name); ok {
		return c.(*sqlCache)
	}
	c, _ := caches.LoadOrStore(name, &sqlCache{})
	return c.(*sqlCache)
}
