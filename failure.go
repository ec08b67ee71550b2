package pgevents

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// unitFailure is what a worker remembers of a failing unit, the
// partition-local slice of one producer transaction. Entries are keyed by
// the unit's transaction id and go once the position has moved past the
// unit.
type unitFailure struct {
	txID      int64 // the unit's producer transaction
	unitFirst int64 // the unit's first offset: where a halt stops
	offset    int64 // the offset of the event that failed last
	err       error
	attempts  int // failures counted towards MaxAttempts
	timeouts  int // handler timeouts and sessions lost in the unit
	first     time.Time
	last      time.Time
}

// unitError is a failure inside a unit.
type unitError struct {
	txID      int64
	unitFirst int64 // the unit's first offset
	offset    int64 // the failing event's offset
	err       error
	timeout   bool   // the unit's time budget ran out
	parkFor   int64  // the unit touches a host parked behind this dead letter
	parkHost  string // that host
}

func (e *unitError) Error() string {
	if e.parkFor != 0 {
		return fmt.Sprintf("unit at offset %d touches a host parked behind dead letter %d", e.offset, e.parkFor)
	}
	return fmt.Sprintf("handler failed at offset %d: %v", e.offset, e.err)
}

func (e *unitError) Unwrap() error { return e.err }

// errHandlerTimeout is the cancellation cause of a unit that exceeded its
// time budget.
var errHandlerTimeout = errors.New("handler timeout")

// errSessionLost is the failure recorded for a unit that was alone in a
// batch whose connection ended before it committed (the server's
// idle_in_transaction_session_timeout, a terminated backend, the network).
var errSessionLost = errors.New("the batch's database session ended before it committed")

// batchFailure is what decide knows of a failed batch.
type batchFailure struct {
	// err is the batch's error.
	err error
	// unit is the unit the failure happened in; nil when it happened
	// outside handlers (claim, fetch, dead-letter writes, commit).
	unit *unitError
	// sessionLost says that the batch's connection ended: the server ended
	// the session or the network failed.
	sessionLost bool
	// idleKilled says that the server ended the session because the batch
	// sat idle in its transaction for longer than
	// idle_in_transaction_session_timeout (SQLSTATE 25P03): its handlers
	// ran that long without a statement.
	idleKilled bool
	// units is the number of units the batch had started.
	units int
	// unitsBefore says that the batch had started units before unit, the
	// one the failure happened in.
	unitsBefore bool
	// narrowed says that the batch had been narrowed to unit alone.
	narrowed bool
}

// verdict is what a worker does after a failed batch. Every verdict rolls
// the batch back and waits for a backoff before the next attempt, so no
// failure, however it is classified, makes a partition spin.
type verdict int

const (
	// retryBatch runs the batch again unchanged.
	retryBatch verdict = iota
	// shrinkBatch runs it again with half the events: the batch's session
	// ended, possibly because the batch took longer than the server allows
	// a transaction to sit idle.
	shrinkBatch
	// narrowToUnit runs it again at once ending before the unit, then,
	// after the backoff, with the unit alone, where MaxAttempts applies to
	// timeouts.
	narrowToUnit
	// parkUnit runs it again with the unit parked behind a dead letter.
	parkUnit
	// deadLetterUnit runs it again with the unit dead-lettered instead of
	// handled.
	deadLetterUnit
	// haltBeforeUnit commits what precedes the unit and stops the
	// partition there.
	haltBeforeUnit
)

// String names the verdict in logs.
func (v verdict) String() string {
	switch v {
	case shrinkBatch:
		return "shrink"
	case narrowToUnit:
		return "narrow"
	case parkUnit:
		return "park"
	case deadLetterUnit:
		return "dead-letter"
	case haltBeforeUnit:
		return "halt"
	}
	return "retry"
}

// failurePolicy is the part of the configuration decide reads, and the
// state of the dead-letter circuit breaker.
type failurePolicy struct {
	maxAttempts int
	onPermanent FailurePolicy
	// breakerOpen says that one more dead letter would exceed
	// MaxDeadLetters within DeadLetterWindow.
	breakerOpen bool
}

// decide is the failure policy, in one pure function: given a failed
// batch, the history of the unit it failed in (updated in place; nil when
// the failure was outside a unit and no unit is to blame) and the policy,
// it returns the verdict and the failure's class.
//
//   - a unit that touches a parked host is parked;
//   - a batch of several units whose session ended shrinks; a unit alone
//     in a batch that the server ended for idling in its transaction counts
//     an attempt, and after MaxAttempts it failed permanently (other ends
//     of a session, such as a network failure, are transient);
//   - a unit whose handlers failed, whatever the class of the failure, in
//     a batch where units preceded it, narrows the batch to it: the next
//     attempt commits the units before it at once, and the unit then runs
//     alone, after the backoff, so one slow or failing statement holds up
//     no unit but its own and those after it;
//   - a unit that ran out of time, whoever enforced it (its handler budget,
//     or the server's statement_timeout or lock_timeout: see
//     unitTimedOut), counts an attempt when it ran alone, and after
//     MaxAttempts it failed permanently;
//   - a unit's error of class permanent, or of class unknown MaxAttempts
//     times, is a permanent failure: halt under PolicyHalt or an open
//     breaker, dead-letter (parking its hosts under PolicyParkHost)
//     otherwise;
//   - anything else is retried: transient and deployment failures
//     forever, narrowed to their unit as above. A failure of the batch's
//     own statements (claim, fetch, dead-letter writes, commit) blames no
//     unit and retries the batch as it is.
func decide(f batchFailure, h *unitFailure, p failurePolicy) (verdict, Class) {
	permanent := func(class Class) (verdict, Class) {
		if p.onPermanent == PolicyHalt || p.breakerOpen {
			return haltBeforeUnit, class
		}
		return deadLetterUnit, class
	}
	// Units went before the failing one in this attempt: they can commit
	// without it.
	prefix := f.unit != nil && f.unitsBefore && !f.narrowed
	switch {
	case f.unit != nil && f.unit.parkFor != 0:
		return parkUnit, ClassPermanent
	case f.sessionLost && f.units > 1:
		return shrinkBatch, ClassTransient
	case f.idleKilled && h != nil:
		h.timeouts++
		h.attempts++
		if h.attempts >= p.maxAttempts {
			return permanent(ClassUnknown)
		}
		return retryBatch, ClassTransient
	case f.unit != nil && unitTimedOut(f.unit):
		h.timeouts++
		if prefix {
			return narrowToUnit, ClassTransient
		}
		h.attempts++
		if h.attempts >= p.maxAttempts {
			return permanent(ClassUnknown)
		}
		return retryBatch, ClassTransient
	case f.unit != nil:
		class := Classify(f.unit.err)
		switch class {
		case ClassPermanent:
			h.attempts++
			return permanent(class)
		case ClassUnknown:
			h.attempts++
			if h.attempts >= p.maxAttempts {
				return permanent(class)
			}
		}
		if prefix {
			return narrowToUnit, class
		}
		return retryBatch, class
	}
	if Classify(f.err) == ClassDeployment {
		return retryBatch, ClassDeployment
	}
	// Claim, fetch, dead-letter writes or commit failed: nothing the
	// events did, so retrying is the only safe course.
	return retryBatch, ClassTransient
}

// unitTimedOut says whether a unit's failure is a timeout of its
// handlers: its budget (HandlerTimeout) ran out, or the server cancelled
// one of its statements for statement_timeout (SQLSTATE 57014, other than
// a cancel request: see statementTimedOut) or lock_timeout (55P03). Both
// are the same fact about a handler, and lead to the same outcome: a
// timeout of the batch's own statements (claim, commit) blames no unit.
func unitTimedOut(ue *unitError) bool {
	return ue.timeout || statementTimedOut(ue.err)
}

// statementTimedOut says whether err is the server's cancellation of a
// statement for statement_timeout or lock_timeout. A cancel request
// (pg_cancel_backend, or the client's own on a cancelled context) has the
// same SQLSTATE as a statement timeout, 57014, and another message; it is
// not the statement's timeout.
func statementTimedOut(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case pgerrLockNotAvailable:
		return true
	case pgerrQueryCanceled:
		return !strings.Contains(pgErr.Message, "user request")
	}
	return false
}

// SQLSTATEs the failure policy tells apart.
const (
	pgerrQueryCanceled     = "57014" // query_canceled: statement_timeout, or a cancel request
	pgerrLockNotAvailable  = "55P03" // lock_not_available: lock_timeout, or NOWAIT
	pgerrIdleInTransaction = "25P03" // idle_in_transaction_session_timeout
)
