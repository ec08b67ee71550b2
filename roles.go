package pgevents

import (
	"context"
	"time"

	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/schema"
)

// The leased roles of a topic (store.Role: the elected watcher, the
// sequencer, maintenance) are held by session advisory locks, one session
// per topic and database at a time. A process that wants a role and finds
// its key held looks every roleCheck whether the holder is frozen (no live
// heartbeat of its replica, no statement for roleGrace:
// store.EndFrozenHolder), and ends its session when it is, so that a
// frozen process (SIGSTOP, a paused VM, a cut network), whose sessions
// live on, holds no role for longer than about roleCheck + roleGrace.
const (
	// roleCheck is how long a process waits for a role's key before it
	// looks whether the holder is frozen: two statements per waiter per
	// roleCheck.
	roleCheck = 2 * time.Second
	// roleGrace is how long a holder's session must have run no statement
	// (besides its replica's heartbeat having lapsed) to be ended. Every
	// holder that is not a replica runs statements more often: `consumer
	// maintain`'s sequencer ticks at least every idleCheck, and
	// maintenance holds its key only while its pass runs statements.
	roleGrace = 2 * idleCheck
)

// awaitRole waits until db's session holds role's key of topic. wait
// waits for the key for at most roleCheck and reports whether the session
// got it (nil: store.WaitRole); each time it did not, the holder's session
// is ended if it is frozen, and the wait starts again.
func awaitRole(ctx context.Context, db schema.DB, role store.Role, topic int, log *zerolog.Logger,
	wait func(context.Context) (bool, error)) error {
	if wait == nil {
		wait = func(ctx context.Context) (bool, error) { return store.WaitRole(ctx, db, role, topic, roleCheck) }
	}
	for {
		got, err := wait(ctx)
		if err != nil || got {
			return err
		}
		if _, err := endFrozenHolder(ctx, db, role, topic, log); err != nil {
			return err
		}
	}
}

// takeRole takes role's key of topic for db's session if no other session
// holds it, or if a frozen one does: it ends that session, and waits for
// at most roleCheck for the key, which the session gives back as it ends.
// It reports whether db's session holds the key.
func takeRole(ctx context.Context, db schema.DB, role store.Role, topic int, log *zerolog.Logger) (bool, error) {
	got, err := store.TryRole(ctx, db, role, topic)
	if err != nil || got {
		return got, err
	}
	ended, err := endFrozenHolder(ctx, db, role, topic, log)
	if err != nil || ended == "" {
		return false, err
	}
	return store.WaitRole(ctx, db, role, topic, roleCheck)
}

// endFrozenHolder ends the session that holds role's key of topic if it is
// frozen (store.EndFrozenHolder), logs it, and returns the session's
// application_name ("" when it ended nothing).
func endFrozenHolder(ctx context.Context, db schema.DB, role store.Role, topic int, log *zerolog.Logger) (string, error) {
	ended, err := store.EndFrozenHolder(ctx, db, role, topic, roleGrace)
	if err != nil || ended == "" {
		return "", err
	}
	if log != nil {
		log.Warn().Str("role", role.String()).Str("session", ended).
			Msgf("ended the session of the topic's %s, whose process shows no sign of life (no replica heartbeat, no statement for %s: frozen, or cut off); taking over", role, roleGrace)
	}
	return ended, nil
}
