package pgevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// LogHandler returns a Handler that writes each event as one JSON line to
// out. Lines are written whole even when several partitions share out.
func LogHandler(out io.Writer) Handler {
	var mu sync.Mutex
	return HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		line, err := json.Marshal(ev)
		if err != nil {
			return Permanent(fmt.Errorf("log handler: encode event %d: %w", ev.Offset, err))
		}
		line = append(line, '\n')
		mu.Lock()
		defer mu.Unlock()
		if _, err := out.Write(line); err != nil {
			return Retryable(fmt.Errorf("log handler: write: %w", err))
		}
		return nil
	})
}

// SQLHandler returns a Handler that runs statement in the consumer's
// transaction for each event, with the pgx named arguments @c_offset,
// @topic_id, @partition_id, @event_id, @host_id, @user_id, @transaction_id,
// @event_type, @payload and @metadata (JSON text, NULL when absent),
// @created_at, @group_id and @epoch (the partition lease's fencing token).
// Its effects commit with the group's offset, exactly once.
//
// A statement that cannot run (a table or column that does not exist, a
// positional parameter such as $1) fails every batch, as a deployment
// failure, retried for ever: CheckSQLHandler finds it before the consumer
// starts.
func SQLHandler(groupID, statement string) Handler {
	return HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		args := pgx.NamedArgs{
			"c_offset": ev.Offset, "topic_id": ev.TopicID, "partition_id": ev.PartitionID,
			"event_id": ev.EventID, "host_id": ev.HostID, "user_id": ev.UserID,
			"transaction_id": ev.TransactionID, "event_type": ev.EventType,
			"payload": jsonText(ev.Payload), "metadata": jsonText(ev.Metadata),
			"created_at": ev.CreatedAt, "group_id": groupID, "epoch": Epoch(tx),
		}
		if _, err := tx.Exec(ctx, statement, args); err != nil {
			return fmt.Errorf("sql handler: %w", err)
		}
		return nil
	})
}

// sqlHandlerParams are the named parameters SQLHandler binds, in the order
// its documentation lists them.
var sqlHandlerParams = []string{"c_offset", "topic_id", "partition_id", "event_id", "host_id", "user_id",
	"transaction_id", "event_type", "payload", "metadata", "created_at", "group_id", "epoch"}

// namedParamRE finds the @name parameters of a statement, for a message.
var namedParamRE = regexp.MustCompile(`@([A-Za-z_][A-Za-z0-9_]*)`)

// CheckSQLHandler returns nil when statement, as SQLHandler runs it, can
// run on conn's database, or an error that says why it cannot: the
// server prepares it (parses, analyses and plans it; nothing is read or
// written, and no lock is held after), with SQLHandler's named parameters
// bound as $1..$n, and its error (a table or column that does not exist,
// a syntax error) is returned wrapped, *pgconn.PgError in its chain. A
// parameter SQLHandler does not bind is an error too: a positional one
// ($1), which the server would refuse at each event, or a named one
// (@paylod), which pgx would bind to NULL.
//
// A statement of several commands (no named parameter: pgx sends it in
// the simple protocol) cannot be prepared; it is not checked.
func CheckSQLHandler(ctx context.Context, conn *pgx.Conn, statement string) error {
	return prefixed(checkSQLHandler(ctx, conn, statement))
}

// checkSQLHandler is CheckSQLHandler without the package's prefix.
func checkSQLHandler(ctx context.Context, conn *pgx.Conn, statement string) error {
	known := pgx.NamedArgs{}
	for _, p := range sqlHandlerParams {
		known[p] = p // any value but nil: a nil one is a name SQLHandler does not bind
	}
	sql, args, err := known.RewriteQuery(ctx, conn, statement, nil)
	if err != nil {
		return fmt.Errorf("sql handler: %w", err)
	}
	bound := "@" + strings.Join(sqlHandlerParams, ", @")
	for _, a := range args {
		if a != nil {
			continue
		}
		var unknown []string
		for _, m := range namedParamRE.FindAllStringSubmatch(statement, -1) {
			if !slices.Contains(sqlHandlerParams, m[1]) && !slices.Contains(unknown, "@"+m[1]) {
				unknown = append(unknown, "@"+m[1])
			}
		}
		return fmt.Errorf("sql handler: the statement names a parameter a sql handler does not bind (%s), which would be NULL; it binds %s",
			strings.Join(unknown, ", "), bound)
	}
	sd, err := conn.PgConn().Prepare(ctx, "", sql, nil)
	if err != nil {
		var pgErr *pgconn.PgError
		if len(args) == 0 && errors.As(err, &pgErr) && pgErr.Code == "42601" && strings.Contains(pgErr.Message, "multiple commands") {
			return nil // several commands: run in the simple protocol, never prepared
		}
		return fmt.Errorf("sql handler: %w", err)
	}
	if n := len(sd.ParamOIDs); n > len(args) {
		return fmt.Errorf("sql handler: there is no parameter $%d: a sql handler binds named parameters only (%s), not positional ones ($1)", len(args)+1, bound)
	}
	return nil
}

func jsonText(b json.RawMessage) any {
	if b == nil {
		return nil
	}
	return string(b)
}
