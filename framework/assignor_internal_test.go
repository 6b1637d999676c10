package framework

import (
	"fmt"
	"slices"
	"testing"
)

// Members join and leave a group of 12 partitions; each rebalance runs the
// cooperative-sticky protocol to its end (members revoke what they lost,
// then rejoin). At every step no partition is assigned to two members,
// partitions that stay are never taken away, and the group converges to a
// balanced assignment of every partition within two rounds.
func TestCooperativeStickyConverges(t *testing.T) {
	parts := map[string]int{"a": 8, "b": 4}
	owned := map[string][]topicPartition{}
	round := func(ids []string) (rounds int) {
		for rounds = 1; rounds <= 5; rounds++ {
			var members []groupMember
			for _, id := range ids {
				members = append(members, groupMember{id: id, topics: []string{"a", "b"}, owned: owned[id]})
			}
			out := assignCooperativeSticky(members, parts)
			seen := map[topicPartition]string{}
			revoked := false
			for _, id := range ids {
				for _, tp := range out[id] {
					if other, dup := seen[tp]; dup {
						t.Fatalf("%v assigned to %s and %s", tp, other, id)
					}
					seen[tp] = id
				}
				for _, tp := range owned[id] {
					if !slices.Contains(out[id], tp) {
						revoked = true
					}
				}
			}
			// Nobody may be handed a partition that another member still owns.
			for _, id := range ids {
				for _, tp := range out[id] {
					for _, other := range ids {
						if other != id && slices.Contains(owned[other], tp) {
							t.Fatalf("%v handed to %s while %s owns it", tp, id, other)
						}
					}
				}
			}
			next := map[string][]topicPartition{}
			for _, id := range ids {
				next[id] = out[id]
			}
			owned = next
			if !revoked {
				return rounds
			}
		}
		t.Fatalf("no convergence in 5 rounds: %v", owned)
		return 0
	}
	check := func(ids []string) {
		total, lo, hi := 0, 1<<30, 0
		for _, id := range ids {
			n := len(owned[id])
			total += n
			lo, hi = min(lo, n), max(hi, n)
		}
		if total != 12 || hi-lo > 1 {
			t.Fatalf("members %v: %d partitions assigned, %d to %d per member; want 12, balanced", ids, total, lo, hi)
		}
	}
	steps := [][]string{{"m1"}, {"m1", "m2"}, {"m1", "m2", "m3"}, {"m2", "m3"}, {"m2", "m3", "m4", "m5"}, {"m5"}}
	for _, ids := range steps {
		before := map[string][]topicPartition{}
		for _, id := range ids {
			before[id] = slices.Clone(owned[id])
		}
		n := round(ids)
		check(ids)
		if n > 2 {
			t.Errorf("members %v: %d rounds to converge, want at most 2", ids, n)
		}
		// Stickiness: a member that stays keeps at least min(before, quota).
		for _, id := range ids {
			kept := 0
			for _, tp := range before[id] {
				if slices.Contains(owned[id], tp) {
					kept++
				}
			}
			if want := min(len(before[id]), 12/len(ids)); kept < want {
				t.Errorf("members %v: %s kept %d of its %d partitions, want at least %d", ids, id, kept, len(before[id]), want)
			}
		}
		t.Logf("%v: %d round(s): %s", ids, n, fmt.Sprint(owned))
	}
}

func TestAssignRange(t *testing.T) {
	out := assignRange([]groupMember{{id: "b", topics: []string{"t"}}, {id: "a", topics: []string{"t"}}}, map[string]int{"t": 5})
	if fmt.Sprint(out["a"]) != "[{t 0} {t 1} {t 2}]" || fmt.Sprint(out["b"]) != "[{t 3} {t 4}]" {
		t.Fatalf("range: %v", out)
	}
}

func TestConsumerProtocolRoundTrip(t *testing.T) {
	owned := []topicPartition{{"a", 1}, {"a", 0}, {"b", 7}}
	topics, got, err := decodeSubscription(encodeSubscription([]string{"a", "b"}, owned, 1))
	if err != nil || fmt.Sprint(topics) != "[a b]" || fmt.Sprint(got) != "[{a 0} {a 1} {b 7}]" {
		t.Fatalf("subscription: %v %v %v", topics, got, err)
	}
	as, err := decodeAssignment(encodeAssignment(owned))
	if err != nil || fmt.Sprint(as) != "[{a 0} {a 1} {b 7}]" {
		t.Fatalf("assignment: %v %v", as, err)
	}
	if as, err := decodeAssignment(nil); err != nil || as != nil {
		t.Fatalf("empty assignment: %v %v", as, err)
	}
	// A newer version's appended fields are ignored; a truncated one fails.
	v3 := append(encodeSubscription([]string{"a"}, nil, 1), 0, 0, 0, 5, 0xff, 0xff)
	v3[1] = 3
	if topics, _, err := decodeSubscription(v3); err != nil || fmt.Sprint(topics) != "[a]" {
		t.Fatalf("v3 subscription: %v %v", topics, err)
	}
	if _, _, err := decodeSubscription([]byte{0, 1, 0, 0}); err == nil {
		t.Fatal("truncated subscription decoded")
	}
	// Version 0, and version 1 without owned partitions (kafka-go's
	// ConsumerGroup writes that), decode with none owned.
	for _, b := range [][]byte{encodeSubscription([]string{"a"}, owned, 0), encodeSubscription([]string{"a"}, nil, 0)} {
		if topics, got, err := decodeSubscription(b); err != nil || fmt.Sprint(topics) != "[a]" || got != nil {
			t.Fatalf("v0 subscription: %v %v %v", topics, got, err)
		}
	}
	v1short := encodeSubscription([]string{"a"}, nil, 0)
	v1short[1] = 1
	if topics, got, err := decodeSubscription(v1short); err != nil || fmt.Sprint(topics) != "[a]" || got != nil {
		t.Fatalf("v1 subscription without owned partitions: %v %v %v", topics, got, err)
	}
}
