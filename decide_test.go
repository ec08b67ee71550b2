package pgevents

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgevents/pgevents/internal/store"
)

// Tests of the failure decisions, without a database: decide (what a
// failed batch does next), planRelease (what resolving a dead letter
// releases) and Classify.

// TestDecide checks the failure policy without a database: each case is
// one failed batch, with the unit's history before it.
func TestDecide(t *testing.T) {
	t.Parallel()
	unit := func(err error) *unitError { return &unitError{txID: 7, unitFirst: 10, offset: 11, err: err} }
	idle := &pgconn.PgError{Code: "25P03", Severity: "FATAL"}
	stmtTimeout := &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}
	lockTimeout := &pgconn.PgError{Code: "55P03", Message: "canceling statement due to lock timeout"}
	cancelled := &pgconn.PgError{Code: "57014", Message: "canceling statement due to user request"}
	cases := []struct {
		name     string
		f        batchFailure
		attempts int // the unit's attempts before
		timeouts int
		p        failurePolicy
		want     verdict
		class    Class
		after    int // the unit's attempts after
	}{
		{"transient in a unit", batchFailure{unit: unit(&pgconn.PgError{Code: "40001"})}, 0, 0, failurePolicy{maxAttempts: 5}, retryBatch, ClassTransient, 0},
		{"deployment in a unit", batchFailure{unit: unit(&pgconn.PgError{Code: "42P01"})}, 0, 0, failurePolicy{maxAttempts: 5}, retryBatch, ClassDeployment, 0},
		{"deployment outside", batchFailure{err: &pgconn.PgError{Code: "42501"}}, 0, 0, failurePolicy{maxAttempts: 5}, retryBatch, ClassDeployment, 0},
		{"anything outside", batchFailure{err: errors.New("commit failed")}, 0, 0, failurePolicy{maxAttempts: 5}, retryBatch, ClassTransient, 0},
		{"permanent dead-letters", batchFailure{unit: unit(Permanent(errors.New("bad")))}, 0, 0, failurePolicy{maxAttempts: 5}, deadLetterUnit, ClassPermanent, 1},
		{"permanent halts under halt", batchFailure{unit: unit(Permanent(errors.New("bad")))}, 0, 0, failurePolicy{maxAttempts: 5, onPermanent: PolicyHalt}, haltBeforeUnit, ClassPermanent, 1},
		{"permanent halts with the breaker open", batchFailure{unit: unit(Permanent(errors.New("bad")))}, 0, 0, failurePolicy{maxAttempts: 5, breakerOpen: true}, haltBeforeUnit, ClassPermanent, 1},
		{"aborted transaction is permanent", batchFailure{unit: unit(fmt.Errorf("%w: x", ErrAbortedTransaction))}, 0, 0, failurePolicy{maxAttempts: 5}, deadLetterUnit, ClassPermanent, 1},
		{"unknown retried", batchFailure{unit: unit(errors.New("?"))}, 3, 0, failurePolicy{maxAttempts: 5}, retryBatch, ClassUnknown, 4},
		{"unknown at max", batchFailure{unit: unit(errors.New("?"))}, 4, 0, failurePolicy{maxAttempts: 5}, deadLetterUnit, ClassUnknown, 5},
		{"parked host", batchFailure{unit: &unitError{txID: 7, parkFor: 3}}, 0, 0, failurePolicy{maxAttempts: 5}, parkUnit, ClassPermanent, 0},
		{"first timeout, alone", batchFailure{unit: &unitError{txID: 7, timeout: true}, units: 1}, 0, 0, failurePolicy{maxAttempts: 5}, retryBatch, ClassTransient, 1},
		{"timeout after other units narrows", batchFailure{unit: &unitError{txID: 7, timeout: true}, units: 3, unitsBefore: true}, 0, 0, failurePolicy{maxAttempts: 5}, narrowToUnit, ClassTransient, 0},
		{"timeout when narrowed counts", batchFailure{unit: &unitError{txID: 7, timeout: true}, narrowed: true, units: 1}, 1, 2, failurePolicy{maxAttempts: 5}, retryBatch, ClassTransient, 2},
		{"timeout when narrowed, at max", batchFailure{unit: &unitError{txID: 7, timeout: true}, narrowed: true, units: 1}, 4, 2, failurePolicy{maxAttempts: 5}, deadLetterUnit, ClassUnknown, 5},
		{"statement timeout is a timeout", batchFailure{unit: unit(stmtTimeout), units: 1}, 1, 1, failurePolicy{maxAttempts: 3}, retryBatch, ClassTransient, 2},
		{"statement timeout at max halts under halt", batchFailure{unit: unit(stmtTimeout), units: 1}, 2, 2, failurePolicy{maxAttempts: 3, onPermanent: PolicyHalt}, haltBeforeUnit, ClassUnknown, 3},
		{"lock timeout at max dead-letters", batchFailure{unit: unit(lockTimeout), units: 1}, 2, 2, failurePolicy{maxAttempts: 3}, deadLetterUnit, ClassUnknown, 3},
		{"statement timeout after other units narrows", batchFailure{unit: unit(stmtTimeout), units: 2, unitsBefore: true}, 0, 0, failurePolicy{maxAttempts: 3}, narrowToUnit, ClassTransient, 0},
		{"a cancel request is not a timeout", batchFailure{unit: unit(cancelled), units: 1}, 4, 0, failurePolicy{maxAttempts: 5}, retryBatch, ClassTransient, 4},
		{"transient after other units narrows", batchFailure{unit: unit(&pgconn.PgError{Code: "40P01"}), units: 4, unitsBefore: true}, 0, 0, failurePolicy{maxAttempts: 5}, narrowToUnit, ClassTransient, 0},
		{"transient when narrowed retries", batchFailure{unit: unit(&pgconn.PgError{Code: "40P01"}), units: 1, narrowed: true}, 0, 0, failurePolicy{maxAttempts: 5}, retryBatch, ClassTransient, 0},
		{"deployment after other units narrows", batchFailure{unit: unit(&pgconn.PgError{Code: "42P01"}), units: 2, unitsBefore: true}, 0, 0, failurePolicy{maxAttempts: 5}, narrowToUnit, ClassDeployment, 0},
		{"unknown after other units counts and narrows", batchFailure{unit: unit(errors.New("?")), units: 2, unitsBefore: true}, 1, 0, failurePolicy{maxAttempts: 5}, narrowToUnit, ClassUnknown, 2},
		{"a claim's statement timeout blames no unit", batchFailure{err: stmtTimeout, units: 3}, 0, 0, failurePolicy{maxAttempts: 1}, retryBatch, ClassTransient, 0},
		{"session lost with several units shrinks", batchFailure{err: idle, sessionLost: true, idleKilled: true, units: 4}, 0, 0, failurePolicy{maxAttempts: 5}, shrinkBatch, ClassTransient, 0},
		{"network lost with several units shrinks", batchFailure{err: errors.New("EOF"), sessionLost: true, units: 4}, 0, 0, failurePolicy{maxAttempts: 5}, shrinkBatch, ClassTransient, 0},
		{"idle kill of a unit alone counts", batchFailure{unit: unit(idle), sessionLost: true, idleKilled: true, units: 1}, 1, 0, failurePolicy{maxAttempts: 5}, retryBatch, ClassTransient, 2},
		{"idle kill of a unit alone at max", batchFailure{unit: unit(idle), sessionLost: true, idleKilled: true, units: 1}, 2, 0, failurePolicy{maxAttempts: 3, onPermanent: PolicyParkHost}, deadLetterUnit, ClassUnknown, 3},
		{"network lost in a unit alone is transient", batchFailure{unit: unit(&pgconn.PgError{Code: "08006"}), sessionLost: true, units: 1}, 4, 0, failurePolicy{maxAttempts: 5}, retryBatch, ClassTransient, 4},
	}
	for _, tc := range cases {
		var h *unitFailure
		if tc.f.unit != nil {
			h = &unitFailure{txID: tc.f.unit.txID, attempts: tc.attempts, timeouts: tc.timeouts}
		}
		v, class := decide(tc.f, h, tc.p)
		if v != tc.want || class != tc.class {
			t.Errorf("%s: decide = %v, %v; want %v, %v", tc.name, v, class, tc.want, tc.class)
		}
		if h != nil && h.attempts != tc.after {
			t.Errorf("%s: %d attempts after, want %d", tc.name, h.attempts, tc.after)
		}
	}
}

// TestPlanRelease checks, without a database, which parked events a
// resolved dead letter releases.
func TestPlanRelease(t *testing.T) {
	t.Parallel()
	parked := func(dl int64, tx int64, off int64, host string) store.Parked {
		return store.Parked{ID: off * 10, DeadLetterID: dl, Event: Event{Offset: off, TransactionID: tx, HostID: host}}
	}
	// Dead letter 1 parks a, 2 parks b. Parked: 3 {b} behind 2; 4-5 {a, b}
	// behind 1; 6 {b} behind 2; 7 {c} behind 1 (a unit of c alone cannot
	// be parked by the worker, but a parked host c can be left by an
	// earlier resolution).
	all := []store.Parked{parked(2, 30, 3, "b"), parked(1, 40, 4, "a"), parked(1, 40, 5, "b"), parked(2, 60, 6, "b"), parked(1, 70, 7, "c")}
	parking := map[int64][]string{1: {"a"}, 2: {"b"}}
	order := []int64{1, 2}
	offs := func(evs []Event) string {
		var out []int64
		for _, e := range evs {
			out = append(out, e.Offset)
		}
		return fmt.Sprint(out)
	}
	// Resolving 2 first: 3 goes; 4-5 wait behind 1 and take b with them,
	// so 6 waits too; 7 goes.
	rel, res := planRelease(2, parking, order, all)
	if offs(rel) != "[3 7]" || fmt.Sprint(res.Released) != "[30 70]" {
		t.Fatalf("resolving 2 released %s (%v), want [3 7]", offs(rel), res.Released)
	}
	if res.Hosts["a"] != 1 || res.Hosts["b"] != 1 || len(res.Hosts) != 2 {
		t.Fatalf("hosts left parked %v, want a and b behind 1", res.Hosts)
	}
	if res.Waiting[40] != 1 || res.Waiting[50] != 1 || res.Waiting[60] != 1 || len(res.Waiting) != 3 {
		t.Fatalf("events left waiting %v, want 4, 5, 6 behind 1", res.Waiting)
	}
	// Resolving 1 first: b is still behind 2, so 4-5 wait behind 2 and a
	// with them; 3 and 6 wait; 7 goes.
	rel, res = planRelease(1, parking, order, all)
	if offs(rel) != "[7]" || res.Hosts["a"] != 2 || res.Hosts["b"] != 2 || res.Waiting[40] != 2 || res.Waiting[30] != 2 {
		t.Fatalf("resolving 1 released %s, left %v / %v", offs(rel), res.Hosts, res.Waiting)
	}
	// The last one releases everything, in offset order.
	rel, res = planRelease(1, map[int64][]string{1: {"a"}}, []int64{1}, all)
	if offs(rel) != "[3 4 5 6 7]" || len(res.Hosts) != 0 || len(res.Waiting) != 0 {
		t.Fatalf("resolving the last dead letter released %s, left %v / %v", offs(rel), res.Hosts, res.Waiting)
	}
}

// TestPlanReleaseKeepsUnitsWhole: the parked events of one unit are not
// always adjacent (another partition's worker parked between them); the
// unit is released or kept whole (found by TestFailureModel).
func TestPlanReleaseKeepsUnitsWhole(t *testing.T) {
	t.Parallel()
	p := func(id, tx, off int64, partition int, host string) store.Parked {
		return store.Parked{ID: id, DeadLetterID: 9, Event: Event{Offset: off, TransactionID: tx, PartitionID: partition, HostID: host}}
	}
	// Unit A (tx 1, partition 0) was parked as ids 1 and 3; unit B (tx 2,
	// partition 1) as id 2, and B's host z is behind dead letter 8.
	parked := []store.Parked{p(1, 1, 10, 0, "x"), p(2, 2, 5, 1, "z"), p(3, 1, 12, 0, "y"), p(4, 2, 6, 1, "y")}
	rel, res := planRelease(9, map[int64][]string{8: {"z"}, 9: {"x"}}, []int64{8, 9}, parked)
	var got []int64
	for _, e := range rel {
		got = append(got, e.Offset)
	}
	if fmt.Sprint(got) != "[10 12]" || fmt.Sprint(res.Released) != "[1 3]" {
		t.Fatalf("released %v (ids %v), want unit A whole: [10 12] (ids [1 3])", got, res.Released)
	}
	if res.Waiting[2] != 8 || res.Waiting[4] != 8 || len(res.Waiting) != 2 {
		t.Fatalf("waiting %v, want unit B whole behind 8", res.Waiting)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: code}) }
	cases := []struct {
		err  error
		want Class
	}{
		{pg("08006"), ClassTransient},
		{pg("40001"), ClassTransient},
		{pg("40P01"), ClassTransient},
		{pg("53300"), ClassTransient},
		{pg("55P03"), ClassTransient},
		{pg("57014"), ClassTransient},
		{pg("57P01"), ClassTransient},
		{context.DeadlineExceeded, ClassTransient},
		{Retryable(errors.New("downstream 503")), ClassTransient},
		{pg("42P01"), ClassDeployment},
		{pg("42703"), ClassDeployment},
		{pg("28P01"), ClassDeployment},
		{pg("3D000"), ClassDeployment},
		{pg("3F000"), ClassDeployment},
		{pg("22P02"), ClassPermanent},
		{pg("23505"), ClassPermanent},
		{Permanent(errors.New("bad data")), ClassPermanent},
		{&PanicError{Value: "x"}, ClassPermanent},
		{fmt.Errorf("%w %q", ErrUnknownEventType, "x"), ClassPermanent},
		{Permanent(pg("40001")), ClassPermanent}, // the handler's word wins
		{errors.New("something else"), ClassUnknown},
		{pg("P0001"), ClassUnknown},
	}
	for _, tc := range cases {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
