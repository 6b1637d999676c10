package offsetfile

import (
	"encoding/binary"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestStateRunsFind: find returns the newest run's change of a key; a key
// no run changed is absent.
func TestStateRunsFind(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var runs stateRuns
	newest := map[string]int{}
	for r := range 50 {
		run := &stateRun{}
		for range 100 {
			k := []byte(fmt.Sprintf("key-%d", rng.IntN(1000)))
			mustOK(t, run.changes.set(k, keyHash(k), []byte{byte(r)}, false))
			newest[string(k)] = r
		}
		runs = append(runs, run)
	}
	for k, r := range newest {
		v, ok := runs.find([]byte(k), keyHash([]byte(k)))
		if !ok || v[1] != byte(r) {
			t.Fatalf("find(%q) = %v, %v; want the change of run %d", k, v, ok, r)
		}
	}
	for i := range 1000 {
		k := []byte(fmt.Sprintf("other-%d", i))
		if _, ok := runs.find(k, keyHash(k)); ok {
			t.Fatalf("find(%q) found a key no run changed", k)
		}
	}
}

// TestChangeSetModel draws random puts and deletes, over few keys (each
// changed again and again) and many (the index growing, the merge's radix
// sort), of three shapes, into sets held to a map each, and merges them:
// every set finds each key's newest change, and the merge is the sets'
// union in key order, the newest set winning.
func TestChangeSetModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 50 {
		keys := 1 + rng.IntN([]int{5, 100, 3000}[round%3])
		sets := make([]*changeSet, 1+rng.IntN(4))
		merged := map[string]*string{}
		for si := range sets {
			c := &changeSet{}
			model := map[string]*string{}
			for range rng.IntN(2 * keys) {
				k := keyOfShape(round, rng.IntN(keys))
				if rng.IntN(4) == 0 {
					mustOK(t, c.set(k, keyHash(k), nil, true))
					model[string(k)] = nil
					continue
				}
				v := fmt.Sprint(rng.IntN(1000))
				if rng.IntN(10) == 0 {
					v = ""
				}
				mustOK(t, c.set(k, keyHash(k), []byte(v), false))
				model[string(k)] = &v
			}
			for k, want := range model {
				got, ok := c.find([]byte(k), keyHash([]byte(k)))
				switch {
				case !ok:
					t.Fatalf("round %d set %d: %s not found", round, si, k)
				case want == nil && got != nil, want != nil && (got == nil || string(got[1:]) != *want):
					t.Fatalf("round %d set %d: %s = %q, want %v", round, si, k, got, want)
				}
			}
			if _, ok := c.find([]byte("absent"), keyHash([]byte("absent"))); ok {
				t.Fatalf("round %d: an absent key found", round)
			}
			if len(c.entries) != len(model) {
				t.Fatalf("round %d: %d entries for %d keys", round, len(c.entries), len(model))
			}
			maps.Copy(merged, model)
			sets[si] = c
		}
		got := mergeChanges(sets...)
		want := slices.Sorted(maps.Keys(merged))
		if len(got) != len(want) {
			t.Fatalf("round %d: merged %d changes, want %d", round, len(got), len(want))
		}
		for i, k := range want {
			c := got[i]
			m := merged[k]
			if string(c.key) != k || (m == nil) != (c.value == nil) || (m != nil && string(c.value[1:]) != *m) {
				t.Fatalf("round %d: change %d is %q=%q, want %q=%v", round, i, c.key, c.value, k, m)
			}
		}
	}
}

// keyOfShape is key i of the round's shape: short keys of several lengths,
// long ones sharing their first 8 bytes (ordered past the merge's prefix),
// or 8 big-endian bytes, as a counter's.
func keyOfShape(round, i int) []byte {
	switch round % 4 {
	case 1:
		return []byte(fmt.Sprint("shared-prefix-", i))
	case 2:
		return binary.BigEndian.AppendUint64(nil, uint64(i))
	case 3:
		return []byte(fmt.Sprint(i%7, "-", i)) // prefixes of one byte, then of more
	}
	return []byte(fmt.Sprint("k", i))
}
