package offsetfile

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestRunIndexModel commits random runs, over few keys and many, and
// writes the oldest queued ones at random moments, as the writer does; at
// each begin, a run's index answers every key as asking the queued runs
// one by one (newest first) does, and stays within its bound of stale
// entries, built anew when over it.
func TestRunIndexModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for round := range 20 {
		space := []int{10, 300, 5000}[round%3]
		x := &runIndex{}
		var queued stateRuns
		var seq uint64
		rebuilt := 0
		for step := range 400 {
			// Commit a run.
			seq++
			run := &stateRun{seq: seq}
			for range rng.IntN(40) {
				k := []byte(fmt.Sprint("k", rng.IntN(space)))
				var v []byte
				if rng.IntN(5) > 0 {
					v = []byte(fmt.Sprint(seq))
				}
				mustOK(t, run.changes.set(k, keyHash(k), v, v == nil))
			}
			queued = append(queued, run)
			// The writer writes the oldest runs.
			if rng.IntN(3) == 0 {
				queued = queued[rng.IntN(len(queued)+1):]
			}
			if len(queued) == 0 {
				continue // BeginState leaves the index alone
			}
			before := x.count
			x.update(queued)
			if x.count < before {
				rebuilt++
			}
			live := 0
			for _, r := range queued {
				live += len(r.changes.entries)
			}
			if x.count > 2*live+256+len(queued[len(queued)-1].changes.entries) {
				t.Fatalf("round %d step %d: %d entries indexed for %d live", round, step, x.count, live)
			}
			lo := queued[0].seq
			for i := range space {
				k := []byte(fmt.Sprint("k", i))
				h := keyHash(k)
				want, wantOK := queued.find(k, h)
				r, got, ok := x.find(k, h)
				if ok = ok && r.seq >= lo; !ok {
					got = nil // stale: the file holds it
				}
				if ok != wantOK || string(got) != string(want) || (got == nil) != (want == nil) {
					t.Fatalf("round %d step %d: %s = %q, %v from the index; %q, %v from the runs", round, step, k, got, ok, want, wantOK)
				}
			}
		}
		if space == 5000 && rebuilt == 0 {
			t.Fatalf("round %d: the index was never built anew over %d keys", round, space)
		}
	}
}
