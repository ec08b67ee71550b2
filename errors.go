package pgevents

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgevents/pgevents/schema"
)

// errPrefix starts every error an exported function of this package
// returns: an error message starts with the name of the package the caller
// imported. internal/store's messages name only the operation ("claim: …"),
// and get this prefix where this package returns them.
const errPrefix = "pgevents: "

// prefixed returns err starting with errPrefix, wrapped with %w so that
// errors.Is and errors.As still find what it wraps; nil stays nil, and an
// error that starts with the prefix already is returned as it is (never
// "pgevents: pgevents: ").
func prefixed(err error) error {
	if err == nil || strings.HasPrefix(err.Error(), errPrefix) {
		return err
	}
	return fmt.Errorf("%s%w", errPrefix, err)
}

// Class says what the consumer does with a failed batch.
type Class int

const (
	// ClassTransient failures roll the batch back and retry it with exponential
	// backoff and jitter, forever; nothing is dead-lettered.
	ClassTransient Class = iota + 1
	// ClassDeployment failures say the deployment is wrong (a table or column
	// that does not exist yet, permissions, a wrong database): they are
	// retried like transient ones and logged at error level, never
	// dead-lettered, so that a consumer started before its migration does
	// not dead-letter everything.
	ClassDeployment
	// ClassPermanent failures will not succeed on retry: the failing unit is
	// dead-lettered and the partition moves on.
	ClassPermanent
	// ClassUnknown failures are retried MaxAttempts times, then treated as
	// permanent.
	ClassUnknown
)

// String returns the class's name as logged.
func (c Class) String() string {
	switch c {
	case ClassTransient:
		return "transient"
	case ClassDeployment:
		return "deployment"
	case ClassPermanent:
		return "permanent"
	case ClassUnknown:
		return "unknown"
	}
	return fmt.Sprintf("Class(%d)", int(c))
}

// ClassifiedError carries the Class a handler chose for its error.
type ClassifiedError struct {
	Class Class
	Err   error
	// After, when positive, is the least time to wait before the batch is
	// tried again (an HTTP Retry-After, say): the consumer waits for the
	// longer of After, capped at Config.RetryMax, and its backoff.
	After time.Duration
}

// Error returns the wrapped error's text.
func (e *ClassifiedError) Error() string { return e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *ClassifiedError) Unwrap() error { return e.Err }

// Permanent marks err as a permanent failure: the event's unit is
// dead-lettered without retry.
func Permanent(err error) error { return &ClassifiedError{Class: ClassPermanent, Err: err} }

// Retryable marks err as a transient failure: the batch is retried forever.
func Retryable(err error) error { return &ClassifiedError{Class: ClassTransient, Err: err} }

// RetryAfter marks err as a transient failure after which the batch is not
// tried again for at least d (capped at Config.RetryMax).
func RetryAfter(err error, d time.Duration) error {
	return &ClassifiedError{Class: ClassTransient, Err: err, After: d}
}

// Deployment marks err as a failure of the deployment (a missing topic,
// credentials refused): retried forever like a transient one, logged at
// error level and counted apart, never dead-lettered.
func Deployment(err error) error { return &ClassifiedError{Class: ClassDeployment, Err: err} }

// retryAfter returns the least wait a ClassifiedError in err asks for.
func retryAfter(err error) time.Duration {
	var ce *ClassifiedError
	if errors.As(err, &ce) {
		return ce.After
	}
	return 0
}

// ErrUnknownEventType is the permanent failure of an event that has no
// handler when the consumer's UnknownEventType policy is Fail.
var ErrUnknownEventType = errors.New("no handler for event type")

// PanicError is the permanent failure of a handler that panicked.
type PanicError struct {
	// Value is what the handler panicked with.
	Value any
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

// Error describes the panic.
func (e *PanicError) Error() string { return fmt.Sprintf("handler panicked: %v", e.Value) }

// Classify is the one place that decides how a failure is treated:
//
//   - a ClassifiedError (from Permanent, Retryable, RetryAfter or
//     Deployment): its Class. Handlers that talk to systems outside
//     PostgreSQL classify those systems' errors themselves and return them
//     wrapped this way, so that this package knows none of those systems:
//     sink/kafkasink classifies Kafka's error codes (see its Classify: broker
//     unreachable, timeouts, not enough replicas, leader changes are
//     transient; unknown topics and authorization failures are deployment;
//     records too large or invalid are permanent) and sink/webhook HTTP
//     answers (408, 429, 5xx and connection errors are transient; 401, 403,
//     407 and redirects are deployment; other 4xx are permanent);
//   - a PanicError, ErrUnknownEventType or ErrAbortedTransaction:
//     ClassPermanent;
//   - an error wrapping schema.ErrTopicNotFound (Append to a topic that
//     does not exist, which the server raises with SQLSTATE 23503):
//     ClassDeployment, so that a handler that appends to a topic not
//     created yet waits for `consumer migrate` instead of dead-lettering;
//   - SQLSTATE classes 08 (connection), 40 (serialization failure,
//     deadlock), 53 (insufficient resources), and 55P03 (lock not
//     available), 57014 (query canceled, statement_timeout), 57P01 (admin
//     shutdown): ClassTransient. A statement of a handler cancelled by
//     statement_timeout or lock_timeout is, besides, a timeout of its
//     unit, which counts towards MaxAttempts as a HandlerTimeout expiry
//     does (see Config.MaxAttempts);
//   - SQLSTATE classes 42 (undefined table or column, syntax, privilege),
//     28 (authorization), 3D (invalid catalog name), 3F (invalid schema
//     name): ClassDeployment;
//   - SQLSTATE classes 22 (data exception) and 23 (integrity constraint
//     violation): ClassPermanent;
//   - a context deadline, a network error, a connection closed or refused:
//     ClassTransient;
//   - anything else: ClassUnknown.
func Classify(err error) Class {
	var ce *ClassifiedError
	if errors.As(err, &ce) {
		return ce.Class
	}
	var pe *PanicError
	if errors.As(err, &pe) || errors.Is(err, ErrUnknownEventType) || errors.Is(err, ErrAbortedTransaction) {
		return ClassPermanent
	}
	if errors.Is(err, schema.ErrTopicNotFound) {
		return ClassDeployment
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		code := pgErr.Code
		switch code {
		case "55P03", "57014", "57P01":
			return ClassTransient
		}
		switch {
		case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "40"), strings.HasPrefix(code, "53"):
			return ClassTransient
		case strings.HasPrefix(code, "42"), strings.HasPrefix(code, "28"),
			strings.HasPrefix(code, "3D"), strings.HasPrefix(code, "3F"):
			return ClassDeployment
		case strings.HasPrefix(code, "22"), strings.HasPrefix(code, "23"):
			return ClassPermanent
		}
		return ClassUnknown
	}
	var netErr net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) ||
		pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return ClassTransient
	}
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) {
		return ClassTransient
	}
	return ClassUnknown
}
