package framework

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Assignment: the group's leader divides the partitions of the subscribed
// topics among the members. Two assignors are offered, in this order of
// preference:
//
//   - cooperative-sticky (KIP-429): members keep the partitions they own
//     where the balance allows; a partition that moves is first revoked by
//     its owner in one rebalance and assigned to its new owner in the next,
//     so no partition is ever consumed by two members, and partitions that
//     stay are never stopped.
//   - range: the classic eager assignor, for groups that still hold members
//     speaking only eager protocols (an older tidemark, a kafka-go Reader);
//     the coordinator picks the protocol every member offers.
const (
	protocolCooperativeSticky = "cooperative-sticky"
	protocolRange             = "range"
)

// groupMember is a member as the leader sees it in a JoinGroup response.
type groupMember struct {
	id     string
	topics []string
	owned  []topicPartition
}

// assign divides partitions (topic -> partition count) among members with
// the named protocol. Members are identified by their member id.
func assign(protocol string, members []groupMember, partitions map[string]int) (map[string][]topicPartition, error) {
	switch protocol {
	case protocolCooperativeSticky:
		return assignCooperativeSticky(members, partitions), nil
	case protocolRange:
		return assignRange(members, partitions), nil
	}
	return nil, fmt.Errorf("unknown assignor %q", protocol)
}

// assignRange gives each member, topic by topic, a contiguous range of the
// topic's partitions: the first members (by id) one more when the count
// does not divide.
func assignRange(members []groupMember, partitions map[string]int) map[string][]topicPartition {
	out := make(map[string][]topicPartition, len(members))
	for _, m := range members {
		out[m.id] = nil
	}
	for _, topic := range sortedKeys(partitions) {
		var subs []string
		for _, m := range members {
			if slices.Contains(m.topics, topic) {
				subs = append(subs, m.id)
			}
		}
		if len(subs) == 0 {
			continue
		}
		slices.Sort(subs)
		n, extra := partitions[topic]/len(subs), partitions[topic]%len(subs)
		next := 0
		for i, id := range subs {
			count := n
			if i < extra {
				count++
			}
			for j := 0; j < count; j++ {
				out[id] = append(out[id], topicPartition{topic, int32(next)})
				next++
			}
		}
	}
	return out
}

// assignCooperativeSticky balances the partitions over the members while
// keeping each partition with its current owner where the balance allows.
// A partition that must move is left out of everyone's assignment this time:
// its owner, not finding it in its own, revokes it and rejoins, and the next
// assignment gives it to a member that needs it.
func assignCooperativeSticky(members []groupMember, partitions map[string]int) map[string][]topicPartition {
	members = slices.Clone(members)
	slices.SortFunc(members, func(a, b groupMember) int { return cmp.Compare(a.id, b.id) })
	out := make(map[string][]topicPartition, len(members))
	subscribed := make(map[string]map[string]bool, len(members))
	for _, m := range members {
		out[m.id] = nil
		subscribed[m.id] = map[string]bool{}
		for _, t := range m.topics {
			subscribed[m.id][t] = true
		}
	}
	exists := func(tp topicPartition) bool { return tp.partition >= 0 && int(tp.partition) < partitions[tp.topic] }

	// Who owns what: a claim counts if the partition exists, the member
	// subscribes to its topic, and no other member claims it too (two
	// claims mean a member missed a rebalance: both give it up).
	claims := map[topicPartition][]string{}
	for _, m := range members {
		for _, tp := range m.owned {
			if exists(tp) && subscribed[m.id][tp.topic] && !slices.Contains(claims[tp], m.id) {
				claims[tp] = append(claims[tp], m.id)
			}
		}
	}
	owner := map[topicPartition]string{}
	for tp, ids := range claims {
		if len(ids) == 1 {
			owner[tp] = ids[0]
		}
	}

	var all []topicPartition
	for _, topic := range sortedKeys(partitions) {
		for p := 0; p < partitions[topic]; p++ {
			tp := topicPartition{topic, int32(p)}
			for _, m := range members {
				if subscribed[m.id][topic] {
					all = append(all, tp)
					break
				}
			}
		}
	}
	if len(members) == 0 {
		return out
	}
	// Quotas: every member floor(N/M), and N mod M of them one more.
	quota, extra := len(all)/len(members), len(all)%len(members)

	// Keep owned partitions: first up to the quota, then one more for as
	// many members as the remainder allows.
	kept := map[topicPartition]bool{}
	var ownedBy = map[string][]topicPartition{}
	for _, tp := range all {
		if id, ok := owner[tp]; ok {
			ownedBy[id] = append(ownedBy[id], tp)
		}
	}
	for _, m := range members {
		for _, tp := range ownedBy[m.id] {
			if len(out[m.id]) < quota {
				out[m.id] = append(out[m.id], tp)
				kept[tp] = true
			}
		}
	}
	for _, m := range members {
		if extra == 0 {
			break
		}
		for _, tp := range ownedBy[m.id] {
			if !kept[tp] && len(out[m.id]) == quota {
				out[m.id] = append(out[m.id], tp)
				kept[tp] = true
				extra--
				break
			}
		}
	}

	// Give the rest to the subscribed member with the fewest partitions.
	// A partition still owned by another member is counted for its new
	// owner but handed over only at the next assignment, once revoked.
	counts := map[string]int{}
	for id, tps := range out {
		counts[id] = len(tps)
	}
	for _, tp := range all {
		if kept[tp] {
			continue
		}
		best := ""
		for _, m := range members {
			if !subscribed[m.id][tp.topic] {
				continue
			}
			if best == "" || counts[m.id] < counts[best] {
				best = m.id
			}
		}
		counts[best]++
		if id, owned := owner[tp]; (owned && id != best) || len(claims[tp]) > 1 {
			continue // revoked by its owner(s) first
		}
		out[best] = append(out[best], tp)
	}
	for id := range out {
		slices.SortFunc(out[id], compareTP)
	}
	return out
}

func compareTP(a, b topicPartition) int {
	if c := cmp.Compare(a.topic, b.topic); c != 0 {
		return c
	}
	return cmp.Compare(a.partition, b.partition)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// The consumer protocol's member metadata (ConsumerProtocolSubscription)
// and assignment (ConsumerProtocolAssignment), in kmsg's encoding. A
// group's members may send any version; each newer version only appends
// fields, which are ignored here.

// encodeSubscription writes version 0 (topics) or 1 (and the owned
// partitions, KIP-429).
func encodeSubscription(topics []string, owned []topicPartition, version int16) []byte {
	m := kmsg.NewConsumerMemberMetadata()
	m.Version, m.Topics = version, topics
	if version >= 1 {
		for _, t := range groupByTopic(owned) {
			m.OwnedPartitions = append(m.OwnedPartitions, kmsg.ConsumerMemberMetadataOwnedPartition{Topic: t.Topic, Partitions: t.Partitions})
		}
	}
	return m.AppendTo(nil)
}

func decodeSubscription(b []byte) (topics []string, owned []topicPartition, err error) {
	m := kmsg.NewConsumerMemberMetadata()
	err = m.ReadFrom(b)
	// Some clients (kafka-go's ConsumerGroup) write version 1 without the
	// owned partitions, or a newer version cut short: read what an older
	// version holds.
	for v := m.Version - 1; err != nil && v >= 0 && len(b) >= 2; v-- {
		older := binary.BigEndian.AppendUint16(nil, uint16(v))
		m = kmsg.NewConsumerMemberMetadata()
		err = m.ReadFrom(append(older, b[2:]...))
	}
	if err != nil {
		return nil, nil, fmt.Errorf("member metadata (%d bytes): %w", len(b), err)
	}
	for _, op := range m.OwnedPartitions {
		if owned, err = appendPartitions(owned, op.Topic, op.Partitions); err != nil {
			return nil, nil, fmt.Errorf("member metadata: %w", err)
		}
	}
	return m.Topics, owned, nil
}

func encodeAssignment(tps []topicPartition) []byte {
	a := kmsg.NewConsumerMemberAssignment()
	a.Version = 1
	for _, t := range groupByTopic(tps) {
		a.Topics = append(a.Topics, kmsg.ConsumerMemberAssignmentTopic{Topic: t.Topic, Partitions: t.Partitions})
	}
	return a.AppendTo(nil)
}

func decodeAssignment(b []byte) ([]topicPartition, error) {
	if len(b) == 0 {
		return nil, nil // nothing assigned
	}
	a := kmsg.NewConsumerMemberAssignment()
	if err := a.ReadFrom(b); err != nil {
		return nil, fmt.Errorf("assignment (%d bytes): %w", len(b), err)
	}
	var tps []topicPartition
	for _, t := range a.Topics {
		var err error
		if tps, err = appendPartitions(tps, t.Topic, t.Partitions); err != nil {
			return nil, fmt.Errorf("assignment (version %d): %w", a.Version, err)
		}
	}
	return tps, nil
}

// topicPartitions is one topic's partitions, sorted.
type topicPartitions struct {
	Topic      string
	Partitions []int32
}

// groupByTopic groups tps by topic, topics and partitions sorted.
func groupByTopic(tps []topicPartition) []topicPartitions {
	byTopic := map[string][]int32{}
	for _, tp := range tps {
		byTopic[tp.topic] = append(byTopic[tp.topic], tp.partition)
	}
	out := make([]topicPartitions, 0, len(byTopic))
	for _, t := range sortedKeys(byTopic) {
		ps := byTopic[t]
		slices.Sort(ps)
		out = append(out, topicPartitions{t, ps})
	}
	return out
}

// appendPartitions appends topic's partitions to tps; a negative one is an
// error.
func appendPartitions(tps []topicPartition, topic string, ps []int32) ([]topicPartition, error) {
	for _, p := range ps {
		if p < 0 {
			return nil, fmt.Errorf("topic %q: negative partition %d", topic, p)
		}
		tps = append(tps, topicPartition{topic, p})
	}
	return tps, nil
}
