package pgeventstest

import (
	"fmt"
	"testing"

	"github.com/pgevents/pgevents"
)

// fakeTB records what a helper reports.
type fakeTB struct {
	testing.TB
	errs []string
}

func (*fakeTB) Helper() {}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}

// TestRequireInOrderReports: an event handled twice, and a host's event
// handled after a later one, are each reported; events in order are not.
func TestRequireInOrderReports(t *testing.T) {
	ev := func(host string, partition int, offset int64) pgevents.Event {
		return pgevents.Event{HostID: host, TopicID: 1, PartitionID: partition, Offset: offset}
	}
	var good Recorder
	good.record(ev("a", 0, 1), ev("b", 1, 2), ev("a", 0, 3), ev("b", 1, 4))
	tb := &fakeTB{}
	good.RequireInOrder(tb)
	if len(tb.errs) != 0 {
		t.Fatalf("events in order reported: %v", tb.errs)
	}
	var bad Recorder
	bad.record(ev("a", 0, 1), ev("a", 0, 3), ev("a", 0, 1), ev("b", 1, 5), ev("b", 1, 4))
	tb = &fakeTB{}
	bad.RequireInOrder(tb)
	if len(tb.errs) != 2 {
		t.Fatalf("reported %q, want the duplicate of offset 1 and host b's offset 4 after 5", tb.errs)
	}
}
