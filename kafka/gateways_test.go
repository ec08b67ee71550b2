package kafka_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents/kafka"
	"github.com/pgevents/pgevents/offsets"
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
	} else {
		// Gateway 1 notices the loss of its session at its next look
		// (within a second) or statement on it; its offset commits are
		// fenced meanwhile, since they run on that session.
		waitFor(t, 5*time.Second, "the gateways to name one coordinator", func() bool {
			return findCoordinator(t, addr[1], "g").NodeID == findCoordinator(t, addr[2], "g").NodeID
		})
	}
}

// commitOffset commits offset for partition 0 of "events" in group g
// through the gateway at addr, as a client outside the group protocol
// does, and returns the partition's error code.
func commitOffset(t *testing.T, addr, g string, offset int64) int16 {
	t.Helper()
	req := kmsg.NewPtrOffsetCommitRequest()
	req.SetVersion(7)
	req.Group, req.Generation, req.MemberID = g, -1, ""
	rt := kmsg.NewOffsetCommitRequestTopic()
	rt.Topic = "events"
	rp := kmsg.NewOffsetCommitRequestTopicPartition()
	rp.Partition, rp.Offset = 0, offset
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp := request(t, addr, req).(*kmsg.OffsetCommitResponse)
	return resp.Topics[0].Partitions[0].ErrorCode
}

// TestStaleCoordinatorCannotCommit: a gateway whose coordinator session
// was ended, before it notices, still believes it coordinates the group;
// a commit it is sent fails (NOT_COORDINATOR), since commits run on that
// session, and the group's position does not move.
func TestStaleCoordinatorCannotCommit(t *testing.T) {
	t.Parallel()
	e := newEnv(t, 2, "", kafka.Options{NodeID: 7})
	e.produceRandom(1, 10, 3)
	if code := commitOffset(t, e.addr, "g", 2); code != 0 {
		t.Fatalf("first commit: error %d", code)
	}
	if _, err := e.pool.Exec(e.ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgevents kafka 7'`); err != nil {
		t.Fatal(err)
	}
	if code := commitOffset(t, e.addr, "g", 5); code != kerr.NotCoordinator.Code {
		t.Errorf("a commit through the gateway whose session was ended: error %d, want NOT_COORDINATOR (%d)", code, kerr.NotCoordinator.Code)
	}
	pos, err := offsets.Positions(e.ctx, e.pool, "g", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if pos[0].Next != 2 {
		t.Errorf("partition 0's position %d after the refused commit, want 2", pos[0].Next)
	}
}
