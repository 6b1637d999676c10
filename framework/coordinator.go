package framework

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// The group protocol's requests (JoinGroup, SyncGroup, Heartbeat,
// LeaveGroup) go to the group's coordinator on connections of the group's
// own, encoded here at the last versions before flexible encoding (JoinGroup
// v5, the others v3: Kafka 2.3 through 4.x accept them; v5 and v3 carry the
// group instance id of static membership). kafka-go v0.4.51 decodes the
// Heartbeat and LeaveGroup responses' fields in the wrong order (error code
// before throttle time), so its Client would never see a heartbeat's
// REBALANCE_IN_PROGRESS, and routes Heartbeat to any broker rather than the
// coordinator.

const (
	apiJoinGroup  = 11
	apiHeartbeat  = 12
	apiLeaveGroup = 13
	apiSyncGroup  = 14
)

// dialCoordinator finds the group's coordinator and connects to it.
func (g *group) dialCoordinator(ctx context.Context) (*brokerConn, error) {
	fctx, cancel := context.WithTimeout(ctx, g.c.cfg.Timeout)
	defer cancel()
	res, err := g.c.client.FindCoordinator(fctx, &kafka.FindCoordinatorRequest{Key: g.c.cfg.GroupID, KeyType: kafka.CoordinatorKeyTypeConsumer})
	if err == nil && res.Error != nil {
		err = res.Error
	}
	if err == nil && res.Coordinator == nil {
		err = fmt.Errorf("no coordinator in the answer")
	}
	if err != nil {
		return nil, fmt.Errorf("finding the coordinator of group %s (brokers %s): %w", g.c.cfg.GroupID, strings.Join(g.c.cfg.Brokers, ","), err)
	}
	addr := net.JoinHostPort(res.Coordinator.Host, strconv.Itoa(res.Coordinator.Port))
	return dialBroker(ctx, &g.c.cfg, addr)
}

// exchange sends one request with the given api key, version and body, and
// returns a reader over the response body. ctx interrupts it; the
// connection is unusable after an error.
func (c *brokerConn) exchange(ctx context.Context, key, version int16, body []byte, timeout time.Duration) (*wireReader, error) {
	_ = c.nc.SetDeadline(time.Now().Add(timeout))
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c.corr++
	req := make([]byte, 4, 4+10+len(c.clientID)+len(body))
	req = binary.BigEndian.AppendUint16(req, uint16(key))
	req = binary.BigEndian.AppendUint16(req, uint16(version))
	req = binary.BigEndian.AppendUint32(req, uint32(c.corr))
	req = appendString(req, c.clientID)
	req = append(req, body...)
	binary.BigEndian.PutUint32(req, uint32(len(req)-4))
	if _, err := c.nc.Write(req); err != nil {
		return nil, c.ioErr(ctx, "sending a group request", err)
	}
	buf, err := c.readResponse(ctx, "group", 64<<20)
	if err != nil {
		return nil, err
	}
	return &wireReader{b: buf}, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// appendNullableString writes "" as null.
func appendNullableString(b []byte, s string) []byte {
	if s == "" {
		return binary.BigEndian.AppendUint16(b, 0xffff)
	}
	return appendString(b, s)
}

func appendBytes(b, p []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
	return append(b, p...)
}

// joinRequest is a JoinGroup v5 request's fields.
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

func (c *brokerConn) joinGroup(ctx context.Context, r joinRequest, timeout time.Duration) (*joinResponse, error) {
	b := appendString(nil, r.group)
	b = binary.BigEndian.AppendUint32(b, uint32(r.sessionTimeout/time.Millisecond))
	b = binary.BigEndian.AppendUint32(b, uint32(r.rebalanceTimeout/time.Millisecond))
	b = appendString(b, r.member)
	b = appendNullableString(b, r.instance)
	b = appendString(b, "consumer")
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.protocols)))
	for i, p := range r.protocols {
		b = appendString(b, p)
		b = appendBytes(b, r.metadata[i])
	}
	rd, err := c.exchange(ctx, apiJoinGroup, 5, b, timeout)
	if err != nil {
		return nil, err
	}
	rd.int32() // throttle
	res := &joinResponse{err: kafkaError(rd.int16())}
	res.generation = rd.int32()
	res.protocol = rd.string()
	res.leader = rd.string()
	res.self = rd.string()
	for n := rd.arrayLen(); n > 0 && rd.err == nil; n-- {
		res.members = append(res.members, joinMember{id: rd.string(), instance: rd.string(), metadata: rd.bytes()})
	}
	if rd.err != nil {
		return nil, fmt.Errorf("JoinGroup response: %w", rd.err)
	}
	return res, nil
}

func (c *brokerConn) syncGroup(ctx context.Context, group string, gen int32, member, instance string, assignments map[string][]byte, timeout time.Duration) ([]byte, error, error) {
	b := appendString(nil, group)
	b = binary.BigEndian.AppendUint32(b, uint32(gen))
	b = appendString(b, member)
	b = appendNullableString(b, instance)
	b = binary.BigEndian.AppendUint32(b, uint32(len(assignments)))
	for _, id := range sortedKeys(assignments) {
		b = appendString(b, id)
		b = appendBytes(b, assignments[id])
	}
	rd, err := c.exchange(ctx, apiSyncGroup, 3, b, timeout)
	if err != nil {
		return nil, nil, err
	}
	rd.int32() // throttle
	kerr := kafkaError(rd.int16())
	assignment := rd.bytes()
	if rd.err != nil {
		return nil, nil, fmt.Errorf("SyncGroup response: %w", rd.err)
	}
	return assignment, kerr, nil
}

// heartbeat returns the coordinator's answer (nil: the generation goes on),
// or err when there was none.
func (c *brokerConn) heartbeat(ctx context.Context, group string, gen int32, member, instance string, timeout time.Duration) (answer, err error) {
	b := appendString(nil, group)
	b = binary.BigEndian.AppendUint32(b, uint32(gen))
	b = appendString(b, member)
	b = appendNullableString(b, instance)
	rd, err := c.exchange(ctx, apiHeartbeat, 3, b, timeout)
	if err != nil {
		return nil, err
	}
	rd.int32() // throttle
	answer = kafkaError(rd.int16())
	if rd.err != nil {
		return nil, fmt.Errorf("Heartbeat response: %w", rd.err)
	}
	return answer, nil
}

func (c *brokerConn) leaveGroup(ctx context.Context, group, member, instance string, timeout time.Duration) error {
	b := appendString(nil, group)
	b = binary.BigEndian.AppendUint32(b, 1)
	b = appendString(b, member)
	b = appendNullableString(b, instance)
	rd, err := c.exchange(ctx, apiLeaveGroup, 3, b, timeout)
	if err != nil {
		return err
	}
	rd.int32() // throttle
	if err := kafkaError(rd.int16()); err != nil {
		return err
	}
	for n := rd.arrayLen(); n > 0 && rd.err == nil; n-- {
		rd.string()
		rd.string() // group instance id
		if err := kafkaError(rd.int16()); err != nil {
			return err
		}
	}
	return rd.err
}
