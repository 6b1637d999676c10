package chaos

import (
	"testing"
)

// The default chaos seeds (chaosSeeds) draw every kind of fault at their
// fault-phase length, with the schedule Run draws on the in-process broker
// and on a real one (which adds abrupt broker restarts).
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
					if a.Op != OpStart && a.Op != OpEnd && a.Op != OpInitial {
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
