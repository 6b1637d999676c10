package chaos

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func testScheduleConfig(seed uint64) ScheduleConfig {
	return ScheduleConfig{Seed: seed, Duration: 2 * time.Minute, Consumers: 3, MaxConsumers: 5, Mix: DefaultMix(),
		MinGap: time.Second, MaxGap: 3 * time.Second}
}

func TestScheduleIsReplayable(t *testing.T) {
	a, err := NewSchedule(testScheduleConfig(7))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewSchedule(testScheduleConfig(7))
	c, _ := NewSchedule(testScheduleConfig(8))
	if !slices.Equal(a, b) {
		t.Fatal("the same seed gave two schedules")
	}
	if slices.Equal(a, c) {
		t.Fatal("seeds 7 and 8 gave the same schedule")
	}
	var lines []string
	for _, x := range a {
		lines = append(lines, x.String())
	}
	t.Logf("seed 7:\n%s", strings.Join(lines, "\n"))
}

// The schedule models the membership: faults target live instances only,
// every SIGKILL/SIGTERM is followed by a restart, faults end within the
// duration, and membership stays within [1, max].
func TestScheduleModel(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		cfg := testScheduleConfig(seed)
		acts, err := NewSchedule(cfg)
		if err != nil {
			t.Fatal(err)
		}
		live := map[string]bool{}
		down := map[string]bool{}
		retired := map[string]bool{}
		open := map[int]bool{}
		kinds := map[Kind]int{}
		for _, a := range acts {
			if a.At > cfg.Duration {
				t.Fatalf("seed %d: %v after the fault phase", seed, a)
			}
			switch a.Op {
			case OpInitial, OpStart, Op(Join):
				if live[a.Target] || retired[a.Target] {
					t.Fatalf("seed %d: %v starts a running or retired instance", seed, a)
				}
				live[a.Target] = true
				delete(down, a.Target)
			case Op(SIGKILL), Op(SIGTERM), Op(Leave):
				if !live[a.Target] {
					t.Fatalf("seed %d: %v targets an instance that is not running", seed, a)
				}
				delete(live, a.Target)
				if a.Op == Op(Leave) {
					retired[a.Target] = true
				} else {
					down[a.Target] = true
				}
			case OpEnd:
				if !open[a.ID] {
					t.Fatalf("seed %d: %v ends a fault that is not open", seed, a)
				}
				delete(open, a.ID)
			case Op(BrokerRestart):
			default:
				if !live[a.Target] {
					t.Fatalf("seed %d: %v targets an instance that is not running", seed, a)
				}
				open[a.ID] = true
			}
			if a.Op != OpEnd && a.Op != OpStart && a.Op != OpInitial {
				kinds[Kind(a.Op)]++
			}
			// Members: running, or down until their restart.
			if n := len(live) + len(down); n < 1 || n > cfg.MaxConsumers {
				t.Fatalf("seed %d: %d members after %v", seed, n, a)
			}
		}
		if len(open) > 0 {
			t.Fatalf("seed %d: faults %v never end", seed, open)
		}
		if seed == 1 {
			t.Logf("seed 1: %v", kinds)
		}
	}
}

func TestParseMix(t *testing.T) {
	m, err := ParseMix("sigkill=3, latency=1,broker-restart=0")
	if err != nil {
		t.Fatal(err)
	}
	if m[SIGKILL] != 3 || m[Latency] != 1 || m[Blackhole] != 0 || m.String() != "sigkill=3,latency=1" {
		t.Fatalf("ParseMix: %v (%s)", m, m)
	}
	if d, _ := ParseMix("default"); d.String() != DefaultMix().String() {
		t.Fatalf("default mix %s", d)
	}
	for _, bad := range []string{"sigkill", "nope=1", "sigkill=-1", "sigkill=x"} {
		if _, err := ParseMix(bad); err == nil {
			t.Errorf("ParseMix(%q) accepted", bad)
		}
	}
	// Only the kinds of the mix happen.
	cfg := testScheduleConfig(3)
	cfg.Mix = Mix{Latency: 1}
	acts, _ := NewSchedule(cfg)
	for _, a := range acts {
		if a.Op != OpInitial && a.Kind != Latency {
			t.Fatalf("mix latency=1 gave %v", a)
		}
	}
}

// In calm phases only graceful membership changes happen, from CalmAfter
// in, and every fault has ended when the phase starts.
func TestScheduleCalmPhases(t *testing.T) {
	for seed := uint64(1); seed <= 30; seed++ {
		cfg := testScheduleConfig(seed)
		cfg.Cycle, cfg.Calm, cfg.CalmAfter = 40*time.Second, 15*time.Second, 5*time.Second
		acts, err := NewSchedule(cfg)
		if err != nil {
			t.Fatal(err)
		}
		started := map[int]time.Duration{}
		calmEvents := 0
		for _, a := range acts {
			inCycle := a.At % cfg.Cycle
			calm := inCycle >= cfg.Cycle-cfg.Calm
			switch a.Op {
			case OpInitial, OpStart:
			case OpEnd:
				// A fault ends at the latest when the calm phase starts.
				if calm && inCycle > cfg.Cycle-cfg.Calm {
					t.Fatalf("seed %d: %v ends inside a calm phase", seed, a)
				}
				if a.At/cfg.Cycle != started[a.ID]/cfg.Cycle {
					t.Fatalf("seed %d: %v, started at %s, outlives its storm", seed, a, started[a.ID])
				}
			default:
				started[a.ID] = a.At
				if calm {
					if !graceful(a.Kind) {
						t.Fatalf("seed %d: %v in a calm phase", seed, a)
					}
					if inCycle < cfg.Cycle-cfg.Calm+cfg.CalmAfter {
						t.Fatalf("seed %d: %v less than %s into a calm phase", seed, a, cfg.CalmAfter)
					}
					calmEvents++
				}
			}
		}
		if calmEvents == 0 {
			t.Fatalf("seed %d: no graceful change in any calm phase", seed)
		}
	}
}
