package offsets

import (
	"context"
	"fmt"

	"github.com/pgevents/pgevents/schema"
)

// The origins of an audited action: the tool it was taken with.
const (
	// OriginConsole is the operator console (package console).
	OriginConsole = "console"
	// OriginCLI is the consumer command's operator commands.
	OriginCLI = "cli"
	// OriginKafka is the Kafka endpoint (package kafka): a Kafka tool's
	// offset commit from outside a group's membership, such as
	// kafka-consumer-groups --reset-offsets. Its actor is the SASL user,
	// or the client id without SASL.
	OriginKafka = "kafka"
)

// AuditEntry is an operator's action as the audit (the console_audit
// table) records it: a reset, a pause, a resume, a cancel, an unhalt, a
// dead letter replayed or discarded, taken from the console or the CLI.
// A nil target field says that the action has no such target.
type AuditEntry struct {
	// Origin is the tool the action was taken with: OriginConsole,
	// OriginCLI, or the name of a service's own tool; required.
	Origin string
	// Actor is who took it: the name an operator signed in to the console
	// with, the operating system's user@hostname for the CLI.
	Actor string
	// Remote is the console client's address; empty for the CLI.
	Remote string
	// Action is what was done: reset, pause, resume, cancel, unhalt,
	// replay or discard; required.
	Action string
	// Topic is the topic acted on.
	Topic *int
	// Group is the consumer group acted on.
	Group *string
	// Partition is the partition acted on.
	Partition *int
	// DeadLetter is the dead letter replayed or discarded.
	DeadLetter *int64
	// Detail says what changed (for a pause, the states before and after).
	Detail string
	// Outcome is "ok", possibly with what was done, or why the action
	// failed.
	Outcome string
}

// Audit records e in the audit. Run it in the action's transaction, so
// that the row exists if and only if the action committed; for an action
// that commits in a transaction of its own (a dead letter's replay), or
// that failed, run it on a pool right after.
func Audit(ctx context.Context, db schema.DB, e AuditEntry) error {
	if e.Origin == "" || e.Action == "" {
		return fmt.Errorf("audit: an entry needs an origin and an action, got %q and %q", e.Origin, e.Action)
	}
	_, err := db.Exec(ctx, schema.SQL(ctx, auditInsertSQL), e.Origin, e.Actor, e.Remote, e.Action,
		e.Topic, e.Group, e.Partition, e.DeadLetter, e.Detail, e.Outcome)
	if err != nil {
		return fmt.Errorf("audit: %w", err)
	}
	return nil
}
