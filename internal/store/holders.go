package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgevents/pgevents/schema"
)

// A group's name belongs to one kind of consumer at a time: pgevents
// replicas, or a consumer of another kind (the Kafka endpoint's group
// members) that holds the group (migration 0018 has the whole argument).
const (
	// holdGroupSQL takes group $1 for a holder described by $3 and $4: for
	// the session when $2 (until releaseGroupSQL or the session's end),
	// else for the calling transaction. SQLSTATE PGG01 while a replica of
	// the group is live; PGG02 when another session holds the group.
	holdGroupSQL = `SELECT {schema}hold_group($1, $2, $3, $4)`

	// releaseGroupSQL gives the session's hold on group $1 back.
	releaseGroupSQL = `SELECT {schema}release_group($1)`

	// groupHolderSQL describes who holds group $1 (NULL: nobody; the
	// group's pgevents replicas may run).
	groupHolderSQL = `SELECT {schema}group_holder($1)`
)

// SQLSTATEs of migration 0018's functions.
const (
	// ReplicasLiveCode is raised by hold_group while a replica of the group
	// is live.
	ReplicasLiveCode = "PGG01"
	// GroupHeldCode is raised by register_replica (a replica's heartbeat)
	// and hold_group while another session holds the group.
	GroupHeldCode = "PGG02"
)

// GroupInUseError says that a group's name is in use by consumers of
// another kind: HoldGroup and the offsets the Kafka endpoint commits return
// it while pgevents replicas of the group are live (By "pgevents
// replicas"), and a replica's start and heartbeat while another consumer
// holds the group (By names it).
type GroupInUseError struct {
	// Group is the group's name.
	Group string
	// By says who uses it: "pgevents replicas", or the holder as it
	// described itself ("the Kafka endpoint's members ...").
	By string
	// Detail names them: the live replicas (id, host, pid, topic), or the
	// holder's own description.
	Detail string
}

func (e *GroupInUseError) Error() string {
	if e.By == ReplicasKind {
		return fmt.Sprintf("group %q is in use by pgevents replicas: %s", e.Group, e.Detail)
	}
	return fmt.Sprintf("group %q is in use by %s", e.Group, e.By)
}

// ReplicasKind is GroupInUseError.By when the group's pgevents replicas
// use it.
const ReplicasKind = "pgevents replicas"

// groupInUse turns the SQLSTATEs of migration 0018 into a
// *GroupInUseError; other errors are returned as they are.
func groupInUse(group string, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return err
	}
	switch pgErr.Code {
	case ReplicasLiveCode:
		return &GroupInUseError{Group: group, By: ReplicasKind, Detail: pgErr.Detail}
	case GroupHeldCode:
		return &GroupInUseError{Group: group, By: pgErr.Detail}
	}
	return err
}

// GroupInUse returns err as a *GroupInUseError when it is one of migration
// 0018's refusals (a replica's registration refused, say), else err.
func GroupInUse(group string, err error) error { return groupInUse(group, err) }

// HoldGroup takes group's name for a consumer that is not a pgevents
// replica, described by holder and detail (what `consumer run` prints when
// it refuses to start): for db's session when session is set (db must then
// be one connection; the hold lasts until ReleaseGroup or the session's
// end, and taking it again on the same session only updates the
// description), else for the transaction db is in. It returns a
// *GroupInUseError while a replica of the group is live (or another session
// holds it), and frees the leases of the group's replicas that are not
// live, ending a batch one of them still runs.
func HoldGroup(ctx context.Context, db schema.DB, group string, session bool, holder, detail string) error {
	if _, err := db.Exec(ctx, schema.SQL(ctx, holdGroupSQL), group, session, holder, detail); err != nil {
		if err := groupInUse(group, err); errors.As(err, new(*GroupInUseError)) {
			return err
		}
		return fmt.Errorf("hold group %q: %w", group, err)
	}
	return nil
}

// ReleaseGroup gives db's session's hold on group back (nothing when it
// holds none).
func ReleaseGroup(ctx context.Context, db schema.DB, group string) error {
	if _, err := db.Exec(ctx, schema.SQL(ctx, releaseGroupSQL), group); err != nil {
		return fmt.Errorf("release group %q: %w", group, err)
	}
	return nil
}

// GroupHolder describes who holds group's name ("" when nobody does: its
// replicas may run).
func GroupHolder(ctx context.Context, db schema.DB, group string) (string, error) {
	var by *string
	if err := db.QueryRow(ctx, schema.SQL(ctx, groupHolderSQL), group).Scan(&by); err != nil {
		return "", fmt.Errorf("holder of group %q: %w", group, err)
	}
	if by == nil {
		return "", nil
	}
	return *by, nil
}
