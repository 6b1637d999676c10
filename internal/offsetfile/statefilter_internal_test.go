package offsetfile

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestStateRunsFind: the filter never hides a key a run changed, and find
// returns the newest run's change of it; a key no run changed is absent.
func TestStateRunsFind(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var runs stateRuns
	newest := map[string]int{}
	for r := range 50 {
		changes := map[string]stateChange{}
		for range 100 {
			k := fmt.Sprintf("key-%d", rng.IntN(1000))
			changes[k] = stateChange{value: []byte{0, byte(r)}}
			newest[k] = r
		}
		runs = append(runs, newStateRun(changes))
	}
	for k, r := range newest {
		c, ok := runs.find(k)
		if !ok || c.value[1] != byte(r) {
			t.Fatalf("find(%q) = %v, %v; want the change of run %d", k, c, ok, r)
		}
	}
	for i := range 1000 {
		k := fmt.Sprintf("other-%d", i)
		if _, ok := runs.find(k); ok {
			t.Fatalf("find(%q) found a key no run changed", k)
		}
	}
	// The filter's false positives stay near what it is sized for.
	fp := 0
	run := runs[0]
	for i := range 10000 {
		if run.filter.mayHold(keyHash(fmt.Sprintf("absent-%d", i))) {
			fp++
		}
	}
	if fp > 1000 {
		t.Fatalf("%d of 10,000 absent keys passed a 100-key run's filter; want about 3%%", fp)
	}
}
