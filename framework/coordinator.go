package framework

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/wire"
)

// The classic group protocol's requests (JoinGroup, SyncGroup, Heartbeat,
// LeaveGroup) go to the group's coordinator on connections of their
// sender's own (the group loop's, the heartbeats'), in the versions package
// wire pins, which carry the group instance id of static membership.

// findCoordinator asks any broker for the group's coordinator and
// remembers its address for the commits and offset reads (coordinatorAddr).
func (g *group) findCoordinator(ctx context.Context) (string, error) {
	req := kmsg.NewPtrFindCoordinatorRequest()
	req.CoordinatorKey = g.c.cfg.GroupID
	req.CoordinatorType = 0 // a consumer group
	fctx, cancel := context.WithTimeout(ctx, g.c.cfg.Timeout)
	defer cancel()
	msg, err := g.c.kafka.Any(fctx, req, g.c.cfg.Timeout)
	if err == nil {
		res := msg.(*kmsg.FindCoordinatorResponse)
		if err = wire.Error(res.ErrorCode); err == nil && res.Host == "" {
			err = fmt.Errorf("no coordinator in the answer")
		}
		if err == nil {
			addr := net.JoinHostPort(res.Host, strconv.Itoa(int(res.Port)))
			g.mu.Lock()
			g.coordAddr = addr
			g.mu.Unlock()
			return addr, nil
		}
	}
	return "", fmt.Errorf("finding the coordinator of group %s (brokers %s): %w", g.c.cfg.GroupID, strings.Join(g.c.cfg.Brokers, ","), err)
}

// coordinatorAddr is the coordinator's address, found if not known.
func (g *group) coordinatorAddr(ctx context.Context) (string, error) {
	g.mu.Lock()
	addr := g.coordAddr
	g.mu.Unlock()
	if addr != "" {
		return addr, nil
	}
	return g.findCoordinator(ctx)
}

// forgetCoordinator drops the coordinator's address after an answer that
// says it moved, or no answer: the next request finds it again.
func (g *group) forgetCoordinator(addr string) {
	g.mu.Lock()
	if g.coordAddr == addr {
		g.coordAddr = ""
	}
	g.mu.Unlock()
}

// toCoordinator sends req to the coordinator through the Consumer's
// client (OffsetCommit, OffsetFetch); a connection error or an answer that
// the coordinator moved makes the next request look it up again.
func (g *group) toCoordinator(ctx context.Context, req kmsg.Request) (kmsg.Response, error) {
	addr, err := g.coordinatorAddr(ctx)
	if err != nil {
		return nil, err
	}
	res, err := g.c.kafka.At(ctx, addr, req, g.c.cfg.Timeout)
	if err != nil {
		g.forgetCoordinator(addr)
		return nil, err
	}
	return res, nil
}

// dialCoordinator finds the group's coordinator and connects to it.
func (g *group) dialCoordinator(ctx context.Context) (*wire.Conn, error) {
	addr, err := g.findCoordinator(ctx)
	if err != nil {
		return nil, err
	}
	return g.c.dial(ctx, addr)
}

// joinRequest is a JoinGroup request's fields.
type joinRequest struct {
	group            string
	sessionTimeout   time.Duration
	rebalanceTimeout time.Duration
	member, instance string
	protocols        []string // names, in order of preference
	metadata         [][]byte // each protocol's subscription
}

type joinMember struct {
	id, instance string
	metadata     []byte
}

type joinResponse struct {
	err                    error
	generation             int32
	protocol, leader, self string
	members                []joinMember
}

// nullable is nil for "".
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func joinGroup(ctx context.Context, conn *wire.Conn, r joinRequest, timeout time.Duration) (*joinResponse, error) {
	req := kmsg.NewPtrJoinGroupRequest()
	req.Group = r.group
	req.SessionTimeoutMillis = int32(r.sessionTimeout / time.Millisecond)
	req.RebalanceTimeoutMillis = int32(r.rebalanceTimeout / time.Millisecond)
	req.MemberID = r.member
	req.InstanceID = nullable(r.instance)
	req.ProtocolType = "consumer"
	for i, p := range r.protocols {
		jp := kmsg.NewJoinGroupRequestProtocol()
		jp.Name, jp.Metadata = p, r.metadata[i]
		req.Protocols = append(req.Protocols, jp)
	}
	msg, err := conn.Do(ctx, req, timeout)
	if err != nil {
		return nil, err
	}
	res := msg.(*kmsg.JoinGroupResponse)
	out := &joinResponse{err: wire.Error(res.ErrorCode), generation: res.Generation, protocol: deref(res.Protocol),
		leader: res.LeaderID, self: res.MemberID}
	for _, m := range res.Members {
		out.members = append(out.members, joinMember{id: m.MemberID, instance: deref(m.InstanceID), metadata: m.ProtocolMetadata})
	}
	return out, nil
}

// syncGroup returns the member's assignment and the coordinator's answer
// (kerr), or err when there was none.
func syncGroup(ctx context.Context, conn *wire.Conn, group string, gen int32, member, instance string, assignments map[string][]byte, timeout time.Duration) (assignment []byte, kerr, err error) {
	req := kmsg.NewPtrSyncGroupRequest()
	req.Group, req.Generation, req.MemberID, req.InstanceID = group, gen, member, nullable(instance)
	for _, id := range slices.Sorted(func(yield func(string) bool) {
		for id := range assignments {
			if !yield(id) {
				return
			}
		}
	}) {
		a := kmsg.NewSyncGroupRequestGroupAssignment()
		a.MemberID, a.MemberAssignment = id, assignments[id]
		req.GroupAssignment = append(req.GroupAssignment, a)
	}
	msg, err := conn.Do(ctx, req, timeout)
	if err != nil {
		return nil, nil, err
	}
	res := msg.(*kmsg.SyncGroupResponse)
	return res.MemberAssignment, wire.Error(res.ErrorCode), nil
}

// heartbeat returns the coordinator's answer (nil: the generation goes on),
// or err when there was none.
func heartbeat(ctx context.Context, conn *wire.Conn, group string, gen int32, member, instance string, timeout time.Duration) (answer, err error) {
	req := kmsg.NewPtrHeartbeatRequest()
	req.Group, req.Generation, req.MemberID, req.InstanceID = group, gen, member, nullable(instance)
	msg, err := conn.Do(ctx, req, timeout)
	if err != nil {
		return nil, err
	}
	return wire.Error(msg.(*kmsg.HeartbeatResponse).ErrorCode), nil
}

func leaveGroup(ctx context.Context, conn *wire.Conn, group, member, instance string, timeout time.Duration) error {
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = group
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID, m.InstanceID = member, nullable(instance)
	req.Members = append(req.Members, m)
	msg, err := conn.Do(ctx, req, timeout)
	if err != nil {
		return err
	}
	res := msg.(*kmsg.LeaveGroupResponse)
	if err := wire.Error(res.ErrorCode); err != nil {
		return err
	}
	for _, m := range res.Members {
		if err := wire.Error(m.ErrorCode); err != nil {
			return err
		}
	}
	return nil
}

// isCoordinatorErr reports an answer that means the coordinator moved.
func isCoordinatorErr(err error) bool {
	return errors.Is(err, kafka.NotCoordinatorForGroup) || errors.Is(err, kafka.GroupCoordinatorNotAvailable)
}
