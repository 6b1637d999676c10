package chaos

import (
	"testing"
	"time"
)

// The default chaos seeds (chaosSeeds) draw every kind of fault at their
// fault-phase length, with the schedule Run draws on the in-process broker
// and on a real one (which adds abrupt broker restarts); TestChaos requires
// each kind to happen, and a proxy-rule fault to act on a request: the
// seeds draw at least one fault of those kinds long and likely enough to
// meet the instance's commits (every 200ms) or requests.
func TestDefaultSeedsCoverEveryKind(t *testing.T) {
	for static, bySeed := range chaosSeeds {
		for d, seed := range bySeed {
			for _, real := range []bool{false, true} {
				cfg, err := Config{Broker: NewReal("127.0.0.1:9", "", "", nil), ConsumerCommand: []string{"x"}, Dir: t.TempDir(), Duration: d, Static: static}.withDefaults()
				if err != nil {
					t.Fatal(err)
				}
				acts, err := NewSchedule(runSchedule(seed, d, cfg.Consumers, cfg.MaxConsumers, cfg.Mix, real))
				if err != nil {
					t.Fatal(err)
				}
				drawn := map[Kind]int{}
				for _, a := range acts {
					if a.Op != OpStart && a.Op != OpEnd && a.Op != OpInitial && substantial(a) {
						drawn[Kind(a.Op)]++
					}
				}
				for _, k := range Kinds {
					if drawn[k] == 0 {
						t.Errorf("static=%v, %s, seed %d, real broker %v: the schedule draws no %s (drawn: %v)", static, d, seed, real, k, drawn)
					}
				}
			}
		}
	}
}

// substantial: a reset, commit delay or commit error that lasts long
// enough, and fires often enough, that it cannot miss its instance's
// traffic (a 2.4s commit error with p=0.65 once hit no commit: its
// instance had no partitions then).
func substantial(a Action) bool {
	switch Kind(a.Op) {
	case CommitError:
		return a.For >= 4*time.Second && a.Probability >= 0.5
	case CommitDelay:
		return a.For >= 4*time.Second
	case Reset:
		return a.For >= 3*time.Second
	}
	return true
}
