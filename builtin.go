package pgevents

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/jackc/pgx/v5"
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

func jsonText(b json.RawMessage) any {
	if b == nil {
		return nil
	}
	return string(b)
}
