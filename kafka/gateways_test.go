package kafka_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents/kafka"
)

// findCoordinator asks the gateway at addr which node coordinates group.
func findCoordinator(t *testing.T, addr, group string) *kmsg.FindCoordinatorResponse {
	t.Helper()
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.SetVersion(2)
	req.CoordinatorKey = group
	return request(t, addr, req).(*kmsg.FindCoordinatorResponse)
}

// TestGatewaysShareAGroup: two gateways serve one database. Both name the
// same coordinator for a group; a member that reaches the group through
// the other gateway is sent to it; once the coordinating gateway stops,
// the other takes the group over, and a member continues from the offsets
// committed through the first: every committed event is handled once, in
// order per host and partition.
func TestGatewaysShareAGroup(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	e := newEnv(t, 4, "", kafka.Options{NodeID: 1})
	gw2, stop2 := e.gateway(kafka.Options{NodeID: 2})
	addr := map[int32]string{1: e.addr, 2: gw2.Addr().String()}
	stops := map[int32]func(){2: stop2}
	want := e.produceRandom(seed, 60, 5)
	n := total(want)

	var coord int32 = -1
	waitFor(t, 10*time.Second, "a coordinator for the group", func() bool {
		r1, r2 := findCoordinator(t, addr[1], "g"), findCoordinator(t, addr[2], "g")
		if r1.ErrorCode != 0 || r2.ErrorCode != 0 {
			return false
		}
		if r1.NodeID != r2.NodeID {
			t.Fatalf("gateway 1 names node %d as the group's coordinator, gateway 2 names %d", r1.NodeID, r2.NodeID)
		}
		coord = r1.NodeID
		return true
	})
	other := int32(3) - coord
	if r := findCoordinator(t, addr[other], "g"); r.Port != int32(portOf(t, addr[coord])) {
		t.Fatalf("gateway %d sends the group to port %d, want the coordinator's %s", other, r.Port, addr[coord])
	}

	s := newSeen()
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	// The first member reaches the group through the gateway that does not
	// coordinate it, and handles a third of the events.
	if err := member(ctx, t, addr[other], "g", "a", s, func() bool { return s.count() >= n/3 }); err != nil {
		t.Fatalf("%v (seed %d)", err, seed)
	}
	if stop := stops[coord]; stop != nil {
		stop()
	} else {
		// Gateway 1 serves the environment's pool: end its coordinator
		// session, whose keys go with it (as when its connection is lost).
		if _, err := e.pool.Exec(e.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgevents kafka 1'`); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var err error
	go func() {
		defer wg.Done()
		err = member(ctx, t, addr[other], "g", "b", s, func() bool { return s.count() >= n })
	}()
	wg.Wait()
	if err != nil {
		t.Fatalf("%v (seed %d)", err, seed)
	}
	s.check(t, want, seed)
	// One coordinator still: the gateways that run name the same node.
	if coord == 2 {
		if r := findCoordinator(t, addr[1], "g"); r.NodeID != 1 {
			t.Errorf("after gateway 2 stopped, gateway 1 names node %d as the coordinator, want itself", r.NodeID)
		}
	} else if r1, r2 := findCoordinator(t, addr[1], "g"), findCoordinator(t, addr[2], "g"); r1.NodeID != r2.NodeID {
		t.Errorf("after gateway 1's session was ended, gateway 1 names node %d as the coordinator, gateway 2 names %d", r1.NodeID, r2.NodeID)
	}
}
