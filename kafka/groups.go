package kafka

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/schema"
)

// Group states, as DescribeGroups names them.
const (
	stateEmpty       = "Empty"
	statePreparing   = "PreparingRebalance"
	stateCompleting  = "CompletingRebalance"
	stateStable      = "Stable"
	groupDeadAfter   = time.Minute // a Kafka group's subscription: DEAD a minute after its last member left
	groupCheckPeriod = 250 * time.Millisecond
)

// coordinator runs the classic group protocol for every group of this
// gateway: membership, rebalances and assignments live in memory (a
// restarted gateway makes the members join again, as a new Kafka
// coordinator does), committed offsets in the database, as the positions
// of the pgevents group of the same name.
type coordinator struct {
	s      *Server
	mu     sync.Mutex
	groups map[string]*group
}

type group struct {
	id           string
	state        string
	generation   int32
	protocolType string
	protocol     string
	leader       string
	members      map[string]*member
	order        []string  // member ids in join order
	deadline     time.Time // of the rebalance in progress
	syncs        map[string]chan syncResult
	// pending counts the joins and commits without membership that are
	// taking the group's name for the session (leases.hold): the name is
	// not given back while one is.
	pending int
	// topics are the pgevents topics the group committed on, each with
	// when a commit last subscribed it there (renewed its subscription).
	topics map[int]time.Time
}

type member struct {
	id, clientID, host string
	instanceID         *string
	protocols          []kmsg.JoinGroupRequestProtocol
	session, rebalance time.Duration
	seen               time.Time
	join               chan *kmsg.JoinGroupResponse // a JoinGroup waiting for the rebalance
	joinVersion        int16
	assignment         []byte
}

type syncResult struct {
	code       int16
	assignment []byte
}

func newCoordinator(s *Server) *coordinator {
	return &coordinator{s: s, groups: map[string]*group{}}
}

func newMemberID(clientID string) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return clientID + "-" + hex.EncodeToString(b)
}

// run expires members whose session ran out, completes rebalances whose
// time ran out, and keeps the subscriptions of groups with members live.
func (c *coordinator) run(ctx context.Context) error {
	t := time.NewTicker(groupCheckPeriod)
	defer t.Stop()
	live := time.Now()
	for {
		select {
		case <-ctx.Done():
			c.mu.Lock()
			for _, g := range c.groups {
				for _, m := range g.members {
					if m.join != nil {
						close(m.join)
						m.join = nil
					}
				}
			}
			c.mu.Unlock()
			return nil
		case now := <-t.C:
			c.mu.Lock()
			var keep []struct {
				group string
				topic int
			}
			for _, g := range c.groups {
				for id, m := range g.members {
					if m.join == nil && now.Sub(m.seen) > m.session {
						c.s.log.Info().Str("group", g.id).Str("member", id).Msg("kafka: member's session expired")
						c.remove(g, id)
					}
				}
				if g.state == statePreparing && (now.After(g.deadline) || c.allJoined(g)) {
					c.complete(g)
				}
				if len(g.members) > 0 && now.Sub(live) > groupDeadAfter/4 {
					for tp := range g.topics {
						keep = append(keep, struct {
							group string
							topic int
						}{g.id, tp})
					}
				}
			}
			c.mu.Unlock()
			c.holds(ctx)
			if len(keep) > 0 {
				live = now
				for _, k := range keep {
					if _, err := offsets.Subscribe(ctx, c.s.pool, k.group, k.topic, offsets.Start{Kind: offsets.Earliest}, groupDeadAfter); err != nil && ctx.Err() == nil {
						c.s.log.Warn().Err(err).Str("group", k.group).Msg("kafka: keeping the group's subscription live")
					}
				}
			}
		}
	}
}

// drop forgets groups this gateway no longer coordinates (its session,
// and their keys with it, was lost): their members' waiting requests end
// with NOT_COORDINATOR, and their next requests find the new coordinator.
func (c *coordinator) drop(groups map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range groups {
		g := c.groups[id]
		if g == nil {
			continue
		}
		for _, m := range g.members {
			if m.join != nil {
				close(m.join)
				m.join = nil
			}
		}
		for sid, ch := range g.syncs {
			ch <- syncResult{code: kerr.NotCoordinator.Code}
			delete(g.syncs, sid)
		}
		delete(c.groups, id)
	}
}

func (c *coordinator) get(id string) *group {
	g := c.groups[id]
	if g == nil {
		g = &group{id: id, state: stateEmpty, members: map[string]*member{}, syncs: map[string]chan syncResult{}, topics: map[int]time.Time{}}
		c.groups[id] = g
	}
	return g
}

// remove drops a member; the others rebalance.
func (c *coordinator) remove(g *group, id string) {
	m := g.members[id]
	if m == nil {
		return
	}
	if m.join != nil {
		close(m.join)
	}
	delete(g.members, id)
	g.order = slices.DeleteFunc(g.order, func(o string) bool { return o == id })
	if ch := g.syncs[id]; ch != nil {
		ch <- syncResult{code: kerr.UnknownMemberID.Code}
		delete(g.syncs, id)
	}
	if len(g.members) == 0 {
		g.state, g.leader, g.protocol = stateEmpty, "", ""
		g.generation++
		return
	}
	c.rebalance(g)
}

// rebalance starts a rebalance: members must join again within their
// rebalance timeout; syncs waiting are told REBALANCE_IN_PROGRESS.
func (c *coordinator) rebalance(g *group) {
	if g.state == statePreparing {
		return
	}
	g.state = statePreparing
	var longest time.Duration
	for _, m := range g.members {
		longest = max(longest, m.rebalance)
	}
	g.deadline = time.Now().Add(longest)
	for id, ch := range g.syncs {
		ch <- syncResult{code: kerr.RebalanceInProgress.Code}
		delete(g.syncs, id)
	}
}

func (c *coordinator) allJoined(g *group) bool {
	for _, m := range g.members {
		if m.join == nil {
			return false
		}
	}
	return len(g.members) > 0
}

// complete ends the joining phase: members that did not join again are
// removed, the generation moves on, and every joined member gets its
// answer (the leader with the members' metadata).
func (c *coordinator) complete(g *group) {
	for id, m := range g.members {
		if m.join == nil {
			delete(g.members, id)
			g.order = slices.DeleteFunc(g.order, func(o string) bool { return o == id })
		}
	}
	if len(g.members) == 0 {
		g.state, g.leader, g.protocol = stateEmpty, "", ""
		g.generation++
		return
	}
	g.generation++
	// The protocol: the first of the first member's that every member
	// supports.
	g.protocol = ""
	first := g.members[g.order[0]]
	for _, p := range first.protocols {
		all := true
		for _, m := range g.members {
			all = all && slices.ContainsFunc(m.protocols, func(q kmsg.JoinGroupRequestProtocol) bool { return q.Name == p.Name })
		}
		if all {
			g.protocol = p.Name
			break
		}
	}
	if g.members[g.leader] == nil {
		g.leader = g.order[0]
	}
	g.state = stateCompleting
	for _, id := range g.order {
		m := g.members[id]
		resp := kmsg.NewPtrJoinGroupResponse()
		resp.SetVersion(m.joinVersion)
		resp.Generation = g.generation
		resp.ProtocolType = kmsg.StringPtr(g.protocolType)
		resp.Protocol = kmsg.StringPtr(g.protocol)
		resp.LeaderID = g.leader
		resp.MemberID = id
		if id == g.leader {
			for _, oid := range g.order {
				o := g.members[oid]
				jm := kmsg.NewJoinGroupResponseMember()
				jm.MemberID, jm.InstanceID = oid, o.instanceID
				for _, p := range o.protocols {
					if p.Name == g.protocol {
						jm.ProtocolMetadata = p.Metadata
					}
				}
				resp.Members = append(resp.Members, jm)
			}
		}
		m.join <- resp
		m.join = nil
		m.seen = time.Now()
	}
}

func (c *coordinator) join(ctx context.Context, cn *conn, r *kmsg.JoinGroupRequest) (kmsg.Response, error) {
	clientID, host := cn.client, cn.c.RemoteAddr().String()
	resp := r.ResponseKind().(*kmsg.JoinGroupResponse)
	resp.Generation = -1
	fail := func(e *kerr.Error) (kmsg.Response, error) { resp.ErrorCode = e.Code; return resp, nil }
	if r.Group == "" {
		return fail(kerr.InvalidGroupID)
	}
	session := time.Duration(r.SessionTimeoutMillis) * time.Millisecond
	if session < time.Second || session > DefaultSessionTimeout {
		return fail(kerr.InvalidSessionTimeout)
	}
	rebalance := session
	if r.Version >= 1 {
		rebalance = time.Duration(r.RebalanceTimeoutMillis) * time.Millisecond
	}
	// The group's name, for this gateway's session, before a member is
	// let in: pgevents replicas of the group refuse to run while it is
	// held, and it is refused while one of them is live (a group's name
	// belongs to one kind of consumer at a time). They are members of
	// another protocol, as far as a Kafka client can tell.
	c.mu.Lock()
	g := c.get(r.Group)
	g.pending++
	detail := c.detail(g, clientID, host)
	c.mu.Unlock()
	err := c.s.leases.hold(ctx, r.Group, detail)
	c.mu.Lock()
	g = c.get(r.Group)
	g.pending--
	if err != nil {
		c.mu.Unlock()
		code := c.refusal(err)
		if code == kerr.UnknownMemberID {
			// The group's members are pgevents replicas: for a member
			// joining, a group of another protocol, as Kafka answers a
			// consumer joining a group of another protocol type.
			code = kerr.InconsistentGroupProtocol
		}
		cn.refuse("join", code.Code, err.Error(), r.Group, "", 0)
		return fail(code)
	}
	if g.protocolType != "" && len(g.members) > 0 && g.protocolType != r.ProtocolType {
		c.mu.Unlock()
		return fail(kerr.InconsistentGroupProtocol)
	}
	id := r.MemberID
	if id == "" {
		id = newMemberID(clientID)
		if r.Version >= 4 {
			// The member must join again with its id (KIP-394).
			c.mu.Unlock()
			resp.MemberID = id
			return fail(kerr.MemberIDRequired)
		}
	}
	m := g.members[id]
	if m == nil {
		if r.MemberID != "" && r.Version < 4 {
			c.mu.Unlock()
			return fail(kerr.UnknownMemberID)
		}
		m = &member{id: id}
		g.members[id] = m
		g.order = append(g.order, id)
	}
	if m.join != nil {
		close(m.join) // an earlier join of the same member: superseded
	}
	m.clientID, m.host, m.instanceID, m.protocols = clientID, host, r.InstanceID, r.Protocols
	m.session, m.rebalance, m.seen, m.joinVersion = session, rebalance, time.Now(), r.Version
	g.protocolType = r.ProtocolType
	ch := make(chan *kmsg.JoinGroupResponse, 1)
	m.join = ch
	c.rebalance(g)
	if c.allJoined(g) {
		c.complete(g)
	}
	c.mu.Unlock()
	select {
	case out, ok := <-ch:
		if !ok {
			return fail(kerr.RebalanceInProgress)
		}
		return out, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *coordinator) sync(ctx context.Context, r *kmsg.SyncGroupRequest) (kmsg.Response, error) {
	resp := r.ResponseKind().(*kmsg.SyncGroupResponse)
	c.mu.Lock()
	g := c.groups[r.Group]
	var m *member
	if g != nil {
		m = g.members[r.MemberID]
	}
	switch {
	case m == nil:
		c.mu.Unlock()
		resp.ErrorCode = kerr.UnknownMemberID.Code
		return resp, nil
	case r.Generation != g.generation:
		c.mu.Unlock()
		resp.ErrorCode = kerr.IllegalGeneration.Code
		return resp, nil
	case g.state == statePreparing:
		c.mu.Unlock()
		resp.ErrorCode = kerr.RebalanceInProgress.Code
		return resp, nil
	case g.state == stateStable:
		resp.MemberAssignment = m.assignment
		c.mu.Unlock()
		resp.ProtocolType, resp.Protocol = kmsg.StringPtr(g.protocolType), kmsg.StringPtr(g.protocol)
		return resp, nil
	}
	m.seen = time.Now()
	if r.MemberID == g.leader {
		for _, id := range g.order {
			g.members[id].assignment = nil
		}
		for _, a := range r.GroupAssignment {
			if am := g.members[a.MemberID]; am != nil {
				am.assignment = a.MemberAssignment
			}
		}
		g.state = stateStable
		for id, ch := range g.syncs {
			ch <- syncResult{assignment: g.members[id].assignment}
			delete(g.syncs, id)
		}
		resp.MemberAssignment = m.assignment
		resp.ProtocolType, resp.Protocol = kmsg.StringPtr(g.protocolType), kmsg.StringPtr(g.protocol)
		c.mu.Unlock()
		return resp, nil
	}
	ch := make(chan syncResult, 1)
	g.syncs[r.MemberID] = ch
	c.mu.Unlock()
	select {
	case res := <-ch:
		resp.ErrorCode, resp.MemberAssignment = res.code, res.assignment
		resp.ProtocolType, resp.Protocol = kmsg.StringPtr(g.protocolType), kmsg.StringPtr(g.protocol)
		return resp, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// check validates a member and generation of a request. As Kafka's
// coordinator does, a commit from outside the group protocol (generation
// -1: a tool, a client that assigns itself partitions) is taken while the
// group has no member, and refused with UNKNOWN_MEMBER_ID while it has
// some; a member's commit of the current generation is taken while the
// group prepares a rebalance (the heartbeat tells the member to join
// again), and refused while it completes one; a heartbeat is told of the
// rebalance while it is prepared.
func (c *coordinator) check(g *group, memberID string, generation int32, commit bool) *kerr.Error {
	empty := g == nil || len(g.members) == 0
	switch {
	case commit && empty && generation < 0:
		return nil
	case commit && empty:
		return kerr.IllegalGeneration
	case generation < 0 && memberID == "" && !commit:
		return nil
	}
	if g == nil || g.members[memberID] == nil {
		return kerr.UnknownMemberID
	}
	if generation != g.generation {
		return kerr.IllegalGeneration
	}
	g.members[memberID].seen = time.Now()
	if commit && g.state == stateCompleting || !commit && g.state == statePreparing {
		return kerr.RebalanceInProgress
	}
	return nil
}

func (c *coordinator) heartbeat(r *kmsg.HeartbeatRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.HeartbeatResponse)
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.check(c.groups[r.Group], r.MemberID, r.Generation, false); e != nil {
		resp.ErrorCode = e.Code
	} else if r.MemberID == "" {
		resp.ErrorCode = kerr.UnknownMemberID.Code
	}
	return resp
}

func (c *coordinator) leave(r *kmsg.LeaveGroupRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.LeaveGroupResponse)
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[r.Group]
	ids := []string{r.MemberID}
	if r.Version >= 3 {
		ids = ids[:0]
		for _, m := range r.Members {
			ids = append(ids, m.MemberID)
		}
	}
	for _, id := range ids {
		lm := kmsg.NewLeaveGroupResponseMember()
		lm.MemberID = id
		if g == nil || g.members[id] == nil {
			lm.ErrorCode = kerr.UnknownMemberID.Code
			if r.Version < 3 {
				resp.ErrorCode = lm.ErrorCode
			}
		} else {
			c.s.log.Info().Str("group", g.id).Str("member", id).Msg("kafka: member left")
			c.remove(g, id)
		}
		if r.Version >= 3 {
			resp.Members = append(resp.Members, lm)
		}
	}
	return resp
}

// commit writes a group's offsets as its pgevents positions: the group is
// subscribed to each topic first (from the earliest retained event, so a
// partition it never committed in is read from the start, as a pgevents
// group's is), then the offsets of each topic are set in one transaction
// (offsets.Commit: a negative offset leaves the partition without a
// committed offset, as Kafka stores it).
//
// A commit from outside the group protocol (a tool's reset) takes the
// group's name for its duration, as a join does: it is refused with
// UNKNOWN_MEMBER_ID while pgevents replicas of the group are live, as
// Kafka refuses a non-member's commit to a group with members. It is an
// operator's action: it goes to the audit (console_audit, origin kafka),
// with the SASL user (or the client id) and the positions it moved, in
// its own transaction.
func (c *coordinator) commit(ctx context.Context, cn *conn, r *kmsg.OffsetCommitRequest) (kmsg.Response, error) {
	resp := r.ResponseKind().(*kmsg.OffsetCommitResponse)
	c.mu.Lock()
	g := c.groups[r.Group]
	e := c.check(g, r.MemberID, r.Generation, true)
	bare := e == nil && (g == nil || len(g.members) == 0)
	var detail string
	if bare {
		g = c.get(r.Group)
		g.pending++
		detail = fmt.Sprintf("a commit without membership from %s", cn.who())
	}
	c.mu.Unlock()
	if bare {
		defer func() {
			c.mu.Lock()
			c.get(r.Group).pending--
			c.mu.Unlock()
			c.s.leases.releaseIf(ctx, r.Group, func() bool { return c.idle(r.Group) })
		}()
		if err := c.s.leases.hold(ctx, r.Group, detail); err != nil {
			e = c.refusal(err)
			cn.refuse("commit", e.Code, err.Error(), r.Group, "", 0)
		}
	}
	for _, rt := range r.Topics {
		ct := kmsg.NewOffsetCommitResponseTopic()
		ct.Topic = rt.Topic
		t := c.s.topics[rt.Topic]
		code := int16(0)
		switch {
		case e != nil:
			code = e.Code
		case t == nil:
			code = kerr.UnknownTopicOrPartition.Code
			cn.refuse("commit", code, "no such topic", r.Group, rt.Topic, 0)
		default:
			n, err := c.s.partitions(ctx, t)
			if err != nil {
				return nil, err
			}
			next := map[int]int64{}
			for _, rp := range rt.Partitions {
				if rp.Partition < 0 || int(rp.Partition) >= n {
					code = kerr.UnknownTopicOrPartition.Code
					cn.refuse("commit", code, "no such partition", r.Group, rt.Topic, rp.Partition)
				} else {
					next[int(rp.Partition)] = rp.Offset
				}
			}
			if code != 0 {
				break
			}
			var audit *offsets.AuditEntry
			if bare {
				audit = &offsets.AuditEntry{Origin: offsets.OriginKafka, Actor: cn.who(), Remote: cn.c.RemoteAddr().String(),
					Action: "reset", Topic: &t.id, Group: &r.Group, Outcome: "ok"}
			}
			if err := c.commitTopic(ctx, r.Group, t.id, next, audit); err != nil {
				code = c.refusal(err).Code
				cn.refuse("commit", code, err.Error(), r.Group, rt.Topic, 0)
			}
		}
		for _, rp := range rt.Partitions {
			cp := kmsg.NewOffsetCommitResponseTopicPartition()
			cp.Partition, cp.ErrorCode = rp.Partition, code
			ct.Partitions = append(ct.Partitions, cp)
		}
		resp.Topics = append(resp.Topics, ct)
	}
	return resp, nil
}

// refusal is the Kafka error answered for err, a failure to take a
// group's name or to commit its offsets, as a broker answers the same
// case: the name in use by pgevents replicas is UNKNOWN_MEMBER_ID (they
// are the group's members, of another protocol); this gateway no longer
// coordinating, NOT_COORDINATOR; a cancelled pgevents group,
// GROUP_ID_NOT_FOUND; a failure of the database that may pass,
// COORDINATOR_NOT_AVAILABLE (retriable); anything else
// UNKNOWN_SERVER_ERROR, which clients do not retry, since it would fail
// the same way again.
func (c *coordinator) refusal(err error) *kerr.Error {
	var inUse *offsets.GroupInUseError
	switch {
	case errors.As(err, &inUse):
		return kerr.UnknownMemberID
	case errors.Is(err, errNotCoordinator), errors.Is(err, errNoSession):
		return kerr.NotCoordinator
	case errors.Is(err, errCancelled):
		return kerr.GroupIDNotFound
	case pgevents.Classify(err) == pgevents.ClassTransient:
		return kerr.CoordinatorNotAvailable
	}
	return kerr.UnknownServerError
}

// errCancelled is returned by commitTopic for a group whose subscription
// to the topic was cancelled (`consumer group cancel`), a terminal state.
var errCancelled = errors.New("the group's subscription is cancelled")

// commitTopic commits on the coordinator session (see leases.onSession),
// subscribing the group first when it has no subscription; audit, when
// set, is recorded in the same transaction, with the positions moved.
func (c *coordinator) commitTopic(ctx context.Context, group string, topic int, next map[int]int64, audit *offsets.AuditEntry) error {
	c.mu.Lock()
	g := c.get(group)
	// A member's commit subscribes the group, and renews its subscription
	// as a heartbeat does: a client that commits without joining (no
	// members to keep it live) keeps holding retention back. A commit
	// from outside the group protocol subscribes a group that has no
	// subscription, and keeps another one live with its own settings (a
	// stopped pgevents group keeps its dead_after).
	live, known := g.topics[topic]
	known = known && time.Since(live) < groupDeadAfter/4
	c.mu.Unlock()
	renewed := false
	err := c.s.leases.onSession(ctx, group, func(db schema.DB) error {
		tx, err := db.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
		if !known || audit != nil {
			state, err := offsets.State(ctx, tx, group, topic)
			if err != nil {
				return err
			}
			switch {
			case state == offsets.Cancelled:
				return fmt.Errorf("group %q on topic %d: %w", group, topic, errCancelled)
			case state == "" || audit == nil:
				if _, err := offsets.Subscribe(ctx, tx, group, topic, offsets.Start{Kind: offsets.Earliest}, groupDeadAfter); err != nil {
					return err
				}
				renewed = true
			case !known:
				if _, err := offsets.KeepLive(ctx, tx, group, topic); err != nil {
					return err
				}
				renewed = true
			}
		}
		var before []offsets.Position
		if audit != nil {
			if before, err = offsets.Positions(ctx, tx, group, topic, 1); err != nil {
				return err
			}
		}
		if err := offsets.Commit(ctx, tx, group, topic, next); err != nil {
			return err
		}
		if audit != nil {
			audit.Detail = moved(before, next)
			if err := offsets.Audit(ctx, tx, *audit); err != nil {
				return err
			}
		}
		return tx.Commit(ctx)
	})
	if err == nil && renewed {
		c.mu.Lock()
		g := c.get(group)
		g.topics[topic] = time.Now()
		c.mu.Unlock()
	}
	return err
}

// moved says what a commit moves, for the audit: "partition 0: 113 -> 1,
// partition 1: none -> 5, partition 2: 7 -> none".
func moved(before []offsets.Position, next map[int]int64) string {
	was := map[int]int64{}
	for _, p := range before {
		was[p.Partition] = p.Next
	}
	ps := make([]int, 0, len(next))
	for p := range next {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	show := func(n int64, ok bool) string {
		if !ok || n < 0 {
			return "none"
		}
		return strconv.FormatInt(max(n, 1), 10)
	}
	var b strings.Builder
	for i, p := range ps {
		if i > 0 {
			b.WriteString(", ")
		}
		w, ok := was[p]
		fmt.Fprintf(&b, "partition %d: %s -> %s", p, show(w, ok), show(next[p], true))
	}
	return b.String()
}

// detail describes group g's members and a joining one, for its holder
// row (what `consumer run` names when it refuses the group). c.mu is
// held.
func (c *coordinator) detail(g *group, clientID, host string) string {
	seen := map[string]bool{}
	var out []string
	add := func(client, host string) {
		h, _, err := net.SplitHostPort(host)
		if err != nil {
			h = host
		}
		m := client + "@" + h
		if !seen[m] {
			seen[m] = true
			out = append(out, m)
		}
	}
	for _, id := range g.order {
		if m := g.members[id]; m != nil {
			add(m.clientID, m.host)
		}
	}
	if clientID != "" || host != "" {
		add(clientID, host)
	}
	slices.Sort(out)
	const most = 8
	if len(out) > most {
		out = append(out[:most], fmt.Sprintf("and %d more", len(out)-most))
	}
	return "members " + strings.Join(out, ", ")
}

// idle reports whether group has no member and nothing taking its name.
func (c *coordinator) idle(group string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.groups[group]
	return g == nil || len(g.members) == 0 && g.pending == 0
}

// holds keeps the groups' names held as their membership says: the
// description of a group with members follows them, and a group left with
// none gives its name back, so that its pgevents replicas may run.
func (c *coordinator) holds(ctx context.Context) {
	held := c.s.leases.heldGroups()
	want := map[string]string{}
	c.mu.Lock()
	for id, g := range c.groups {
		if len(g.members) > 0 {
			want[id] = c.detail(g, "", "")
		}
	}
	c.mu.Unlock()
	for id, d := range want {
		if held[id] != d {
			if err := c.s.leases.hold(ctx, id, d); err != nil && ctx.Err() == nil && !errors.Is(err, errNotCoordinator) {
				c.s.log.Warn().Err(err).Str("kafka_group", id).Msg("kafka: updating the group's holder")
			}
		}
	}
	for id := range held {
		if _, ok := want[id]; !ok {
			c.s.leases.releaseIf(ctx, id, func() bool { return c.idle(id) })
		}
	}
}

// fetchOffsets answers OffsetFetch from the pgevents group's positions: a
// partition without one answers -1 (the client applies its
// auto.offset.reset).
func (c *coordinator) fetchOffsets(ctx context.Context, r *kmsg.OffsetFetchRequest) (kmsg.Response, error) {
	resp := r.ResponseKind().(*kmsg.OffsetFetchResponse)
	type ask struct {
		name string
		ps   []int32 // nil: every partition
	}
	var asks []ask
	if r.Topics == nil {
		for name := range c.s.topics {
			asks = append(asks, ask{name: name})
		}
		slices.SortFunc(asks, func(a, b ask) int { return strings.Compare(a.name, b.name) })
	}
	for _, rt := range r.Topics {
		asks = append(asks, ask{name: rt.Topic, ps: rt.Partitions})
	}
	for _, a := range asks {
		ft := kmsg.NewOffsetFetchResponseTopic()
		ft.Topic = a.name
		t := c.s.topics[a.name]
		if t == nil {
			for _, p := range a.ps {
				fp := kmsg.NewOffsetFetchResponseTopicPartition()
				fp.Partition, fp.Offset, fp.ErrorCode = p, -1, kerr.UnknownTopicOrPartition.Code
				ft.Partitions = append(ft.Partitions, fp)
			}
			resp.Topics = append(resp.Topics, ft)
			continue
		}
		pos, err := offsets.Positions(ctx, c.s.pool, r.Group, t.id, 1)
		if err != nil {
			return nil, err
		}
		next := map[int32]int64{}
		for _, p := range pos {
			next[int32(p.Partition)] = p.Next
		}
		ps := a.ps
		if ps == nil {
			for p, n := range next {
				if n >= 0 {
					ps = append(ps, p)
				}
			}
			slices.Sort(ps)
		}
		for _, p := range ps {
			fp := kmsg.NewOffsetFetchResponseTopicPartition()
			fp.Partition, fp.Offset, fp.LeaderEpoch = p, -1, -1
			if n, ok := next[p]; ok {
				fp.Offset = n
			}
			ft.Partitions = append(ft.Partitions, fp)
		}
		resp.Topics = append(resp.Topics, ft)
	}
	return resp, nil
}

func (c *coordinator) describe(ctx context.Context, r *kmsg.DescribeGroupsRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.DescribeGroupsResponse)
	owned := map[string]bool{}
	for _, id := range r.Groups {
		owned[id] = c.s.leases.owns(ctx, id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, id := range r.Groups {
		dg := kmsg.NewDescribeGroupsResponseGroup()
		dg.Group = id
		if !owned[id] {
			dg.ErrorCode = kerr.NotCoordinator.Code
			resp.Groups = append(resp.Groups, dg)
			continue
		}
		g := c.groups[id]
		if g == nil {
			dg.State = "Dead"
			resp.Groups = append(resp.Groups, dg)
			continue
		}
		dg.State, dg.ProtocolType, dg.Protocol = g.state, g.protocolType, g.protocol
		for _, mid := range g.order {
			m := g.members[mid]
			dm := kmsg.NewDescribeGroupsResponseGroupMember()
			dm.MemberID, dm.InstanceID, dm.ClientID, dm.ClientHost = mid, m.instanceID, m.clientID, m.host
			for _, p := range m.protocols {
				if p.Name == g.protocol {
					dm.ProtocolMetadata = p.Metadata
				}
			}
			dm.MemberAssignment = m.assignment
			dg.Members = append(dg.Members, dm)
		}
		resp.Groups = append(resp.Groups, dg)
	}
	return resp
}

func (c *coordinator) list(r *kmsg.ListGroupsRequest) kmsg.Response {
	resp := r.ResponseKind().(*kmsg.ListGroupsResponse)
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]string, 0, len(c.groups))
	for id := range c.groups {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		g := c.groups[id]
		if len(r.StatesFilter) > 0 && !slices.Contains(r.StatesFilter, g.state) {
			continue
		}
		lg := kmsg.NewListGroupsResponseGroup()
		lg.Group, lg.ProtocolType, lg.GroupState = id, g.protocolType, g.state
		resp.Groups = append(resp.Groups, lg)
	}
	return resp
}
