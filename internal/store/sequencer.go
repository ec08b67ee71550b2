package store

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// The sequencer of a sequenced topic (migration 0016): one process at a
// time per topic holds the topic's sequencer key (RoleSequencer, a session
// advisory lock: the key goes with the session, and a process killed, or
// whose connection drops, leaves it to the next; roles.go for a frozen
// one) and runs its ticks, which move what committed in the staging
// tables into the log, with gapless offsets per partition, in one
// transaction each.
const (
	// SequencerChannel is the channel on which an append to a sequenced
	// topic wakes its sequencer when it sleeps (wake_sequencer), with the
	// topic id as the payload.
	SequencerChannel = "pgevents_sequencer"

	// tickSQL runs one tick (sequence_tick: a look without a lock, then,
	// if something committed, the tick's transaction); it returns the
	// number of events sequenced.
	tickSQL = `SELECT {schema}sequence_tick($1)`

	// sequencerSleepSQL takes the topic's sequencer sleep key exclusive,
	// without waiting: it fails while an append is in flight (appends hold
	// it shared to commit). Held, it makes every append notify
	// (wake_sequencer).
	sequencerSleepSQL = `SELECT pg_try_advisory_lock({schema}lock_key('sequencer', $1::integer || '/sleep'))`
	// sequencerAwakeSQL gives the sleep key back.
	sequencerAwakeSQL = `SELECT pg_advisory_unlock({schema}lock_key('sequencer', $1::integer || '/sleep'))`

	// rotateSQL rotates the topic's staging tables when it can do so
	// without waiting (rotate_stage).
	rotateSQL = `SELECT {schema}rotate_stage($1)`

	// sequencedSQL tells whether a topic is sequenced.
	sequencedSQL = `SELECT {schema}topic_sequenced($1)`
)

// Sequenced reports whether topic is a sequenced topic.
func Sequenced(ctx context.Context, db schema.DB, topic int) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, schema.SQL(ctx, sequencedSQL), topic).Scan(&ok); err != nil {
		return false, fmt.Errorf("is topic %d sequenced: %w", topic, err)
	}
	return ok, nil
}

// ListenSequencer listens on SequencerChannel, on the session that holds
// the topic's sequencer key (RoleSequencer): a sleeping sequencer is woken
// there.
func ListenSequencer(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, `LISTEN `+SequencerChannel); err != nil {
		return fmt.Errorf("listen for the sequencer: %w", err)
	}
	return nil
}

// Tick runs one tick of topic's sequencer and returns how many events it
// sequenced.
func Tick(ctx context.Context, db schema.DB, topic int) (int, error) {
	var n int
	if err := db.QueryRow(ctx, schema.SQL(ctx, tickSQL), topic).Scan(&n); err != nil {
		return 0, fmt.Errorf("tick of topic %d: %w", topic, err)
	}
	return n, nil
}

// SequencerSleep tries to take topic's sequencer sleep key for db's
// session; it reports false while an append is in flight.
func SequencerSleep(ctx context.Context, db schema.DB, topic int) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, schema.SQL(ctx, sequencerSleepSQL), topic).Scan(&ok); err != nil {
		return false, fmt.Errorf("sequencer sleep key of topic %d: %w", topic, err)
	}
	return ok, nil
}

// SequencerAwake gives topic's sequencer sleep key back.
func SequencerAwake(ctx context.Context, db schema.DB, topic int) error {
	if _, err := db.Exec(ctx, schema.SQL(ctx, sequencerAwakeSQL), topic); err != nil {
		return fmt.Errorf("sequencer sleep key of topic %d: %w", topic, err)
	}
	return nil
}

// RotateStage rotates topic's staging tables if it can without waiting,
// and reports whether it did.
func RotateStage(ctx context.Context, db schema.DB, topic int) (bool, error) {
	var ok bool
	if err := db.QueryRow(ctx, schema.SQL(ctx, rotateSQL), topic).Scan(&ok); err != nil {
		return false, fmt.Errorf("rotate the staging tables of topic %d: %w", topic, err)
	}
	return ok, nil
}
