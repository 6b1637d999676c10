package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Kind is a kind of fault (or membership change) the schedule injects.
type Kind string

// The kinds of fault. Process faults target one consumer instance; network
// and commit faults act on the instance's own fault proxy, so they hit
// that instance only; broker restarts hit everyone.
const (
	SIGKILL       Kind = "sigkill"        // kill -9 an instance, restart it (same offset file) after a pause
	SIGTERM       Kind = "sigterm"        // stop an instance gracefully, restart it after a pause
	Join          Kind = "join"           // start a new instance (new offset file)
	Leave         Kind = "leave"          // stop an instance gracefully for good
	Latency       Kind = "latency"        // latency with jitter on every request of an instance
	Reset         Kind = "reset"          // reset an instance's connections, now and at random for a while
	Blackhole     Kind = "blackhole"      // stall all of an instance's traffic (sometimes past the session timeout)
	CommitDelay   Kind = "commit-delay"   // hold an instance's OffsetCommit requests past its client timeout
	CommitError   Kind = "commit-error"   // answer an instance's commits with a coordinator error
	BrokerRestart Kind = "broker-restart" // restart the broker with its data
)

// KfakeJanitor is not injected: it records the harness removing the
// group's members to break a livelock of the in-process broker (see
// JanitorAfter).
const KfakeJanitor Kind = "kfake-janitor"

// Kinds lists every kind, in the order reports use.
var Kinds = []Kind{SIGKILL, SIGTERM, Join, Leave, Latency, Reset, Blackhole, CommitDelay, CommitError, BrokerRestart}

// Mix weighs the kinds: at each step of the schedule a kind is drawn with
// probability weight/sum. A kind absent or weighted 0 never happens.
type Mix map[Kind]int

// DefaultMix is the mix used unless told otherwise.
func DefaultMix() Mix {
	return Mix{SIGKILL: 3, SIGTERM: 2, Join: 1, Leave: 1, Latency: 2, Reset: 2, Blackhole: 2, CommitDelay: 2, CommitError: 2, BrokerRestart: 1}
}

// ParseMix parses "sigkill=3,latency=1,...". Kinds not named get 0, so
// "sigkill=1" injects only SIGKILLs; "default" is DefaultMix.
func ParseMix(s string) (Mix, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "default" {
		return DefaultMix(), nil
	}
	m := Mix{}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("chaos: fault mix %q: %q is not kind=weight", s, part)
		}
		kind := Kind(strings.TrimSpace(k))
		if !slices.Contains(Kinds, kind) {
			return nil, fmt.Errorf("chaos: fault mix %q: unknown kind %q (kinds: %s)", s, kind, kindList())
		}
		w, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || w < 0 {
			return nil, fmt.Errorf("chaos: fault mix %q: weight of %s must be a non-negative integer", s, kind)
		}
		m[kind] = w
	}
	return m, nil
}

func kindList() string {
	var s []string
	for _, k := range Kinds {
		s = append(s, string(k))
	}
	return strings.Join(s, ", ")
}

// String formats the mix as ParseMix reads it.
func (m Mix) String() string {
	var s []string
	for _, k := range Kinds {
		if m[k] > 0 {
			s = append(s, fmt.Sprintf("%s=%d", k, m[k]))
		}
	}
	return strings.Join(s, ",")
}

// Op is what an Action does.
type Op string

// Ops beyond the fault kinds themselves.
const (
	OpStart   Op = "start"   // restart an instance after a SIGKILL or SIGTERM
	OpEnd     Op = "end"     // end a fault started by an earlier action
	OpInitial Op = "initial" // start one of the initial instances
)

// Action is one step of a schedule.
type Action struct {
	At time.Duration // since the start of the fault phase
	// Op is a fault kind, OpStart, OpEnd or OpInitial.
	Op Op
	// Kind is the fault kind the action belongs to (for OpEnd and OpStart,
	// the fault it ends or follows).
	Kind Kind
	// Target is the instance ("c3"), or "" for the broker.
	Target string
	// ID pairs a fault with its end.
	ID int
	// For is the fault's duration, or the pause before a restart.
	For time.Duration
	// Fault parameters.
	Latency, Jitter time.Duration // Latency
	Probability     float64       // Reset, CommitError
	Code            int16         // CommitError
	Delay           time.Duration // CommitDelay
	Kill            bool          // BrokerRestart: abrupt (real broker only)
}

func (a Action) String() string {
	return fmt.Sprintf("%8.2fs  %s", a.At.Seconds(), a.Describe())
}

// Describe is String without the time.
func (a Action) Describe() string {
	var b strings.Builder
	switch a.Op {
	case OpInitial:
		fmt.Fprintf(&b, "start %s", a.Target)
	case OpStart:
		fmt.Fprintf(&b, "restart %s (after %s)", a.Target, a.Kind)
	case OpEnd:
		fmt.Fprintf(&b, "end #%d %s", a.ID, a.Kind)
		if a.Target != "" {
			fmt.Fprintf(&b, " on %s", a.Target)
		}
	default:
		fmt.Fprintf(&b, "#%d %s", a.ID, a.Op)
		if a.Target != "" {
			fmt.Fprintf(&b, " %s", a.Target)
		}
		switch Kind(a.Op) {
		case SIGKILL, SIGTERM:
			fmt.Fprintf(&b, ", restart after %s", a.For.Round(time.Millisecond))
		case Latency:
			fmt.Fprintf(&b, " %s±%s for %s", a.Latency.Round(time.Millisecond), a.Jitter.Round(time.Millisecond), a.For.Round(time.Millisecond))
		case Reset:
			fmt.Fprintf(&b, " now, then p=%.2f per request for %s", a.Probability, a.For.Round(time.Millisecond))
		case Blackhole:
			fmt.Fprintf(&b, " for %s", a.For.Round(time.Millisecond))
		case CommitDelay:
			fmt.Fprintf(&b, " %s per OffsetCommit for %s", a.Delay.Round(time.Millisecond), a.For.Round(time.Millisecond))
		case CommitError:
			fmt.Fprintf(&b, " code %d (%s) p=%.2f for %s", a.Code, codeName(a.Code), a.Probability, a.For.Round(time.Millisecond))
		case BrokerRestart:
			how := "clean stop"
			if a.Kill {
				how = "SIGKILL"
			}
			if a.For > 0 {
				how += ", down " + a.For.Round(time.Millisecond).String()
			}
			fmt.Fprintf(&b, " (%s)", how)
		}
	}
	return b.String()
}

// Commit error codes the schedule synthesizes.
var commitCodes = []int16{14, 15, 16, 27}

func codeName(c int16) string {
	switch c {
	case 14:
		return "COORDINATOR_LOAD_IN_PROGRESS"
	case 15:
		return "COORDINATOR_NOT_AVAILABLE"
	case 16:
		return "NOT_COORDINATOR"
	case 27:
		return "REBALANCE_IN_PROGRESS"
	}
	return "?"
}

// ScheduleConfig shapes a schedule.
type ScheduleConfig struct {
	Seed     uint64
	Duration time.Duration // fault phase
	// Consumers start at once; the membership stays within [1,
	// MaxConsumers].
	Consumers    int
	MaxConsumers int
	Mix          Mix
	// MinGap and MaxGap bound the pause between two fault actions.
	MinGap, MaxGap time.Duration
	// BrokerKill: the broker is a real one, which can also be restarted
	// abruptly (SIGKILL) and needs no pause between stop and start.
	BrokerKill bool
	// Cycle and Calm: the last Calm of every Cycle is calm: faults started
	// before are cut short at its start, and only graceful membership
	// changes (sigterm, join, leave) happen, the first CalmAfter into it,
	// so that their hand-offs happen with no fault near them. Zero Cycle:
	// no calm phases.
	Cycle, Calm, CalmAfter time.Duration
}

// Default calm phases: 15s of every 40s, graceful changes from 5s in.
const (
	DefaultCycle     = 40 * time.Second
	DefaultCalm      = 15 * time.Second
	DefaultCalmAfter = Margin
)

// graceful kinds happen in calm phases too.
func graceful(k Kind) bool { return k == SIGTERM || k == Join || k == Leave }

// quiet is how long before the end of the fault phase the last fault
// starts, so that every restart happens within the phase.
const quiet = 5 * time.Second

// NewSchedule draws a schedule from cfg.Seed: the same config gives the
// same actions. It models the membership as it goes, so that every action
// names its target: the initial instances c1..cN start at 0, a SIGKILL or
// SIGTERM is followed by the instance's restart, a join adds the next
// instance, a leave retires one; faults target live instances. Every fault
// ends by cfg.Duration.
func NewSchedule(cfg ScheduleConfig) ([]Action, error) {
	if cfg.Consumers < 1 || cfg.MaxConsumers < cfg.Consumers {
		return nil, fmt.Errorf("chaos: schedule needs 1 <= consumers (%d) <= max consumers (%d)", cfg.Consumers, cfg.MaxConsumers)
	}
	if cfg.MinGap <= 0 || cfg.MaxGap < cfg.MinGap {
		return nil, fmt.Errorf("chaos: schedule gaps [%s, %s] invalid", cfg.MinGap, cfg.MaxGap)
	}
	if cfg.Cycle < 0 || cfg.Calm < 0 || cfg.CalmAfter < 0 || (cfg.Cycle > 0 && cfg.Calm+cfg.CalmAfter >= cfg.Cycle) {
		return nil, fmt.Errorf("chaos: calm phases (%s after %s of every %s) invalid", cfg.Calm, cfg.CalmAfter, cfg.Cycle)
	}
	// calmAt says whether t is in a calm phase, and when that phase
	// starts; storm ends when the next calm phase starts.
	calmAt := func(t time.Duration) (bool, time.Duration) {
		if cfg.Cycle == 0 {
			return false, 0
		}
		start := t - t%cfg.Cycle + cfg.Cycle - cfg.Calm
		return t >= start, start
	}
	stormEnd := func(t time.Duration) time.Duration {
		if in, start := calmAt(t); cfg.Cycle > 0 && !in {
			return start
		}
		return cfg.Duration
	}
	gracefulTotal := 0
	for k, w := range cfg.Mix {
		if graceful(k) {
			gracefulTotal += w
		}
	}
	total := 0
	for _, w := range cfg.Mix {
		total += w
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed5eed5eed5eed))
	uniform := func(lo, hi time.Duration) time.Duration {
		if hi <= lo {
			return lo
		}
		return lo + time.Duration(rng.Int64N(int64(hi-lo)))
	}
	var out []Action
	id := 0
	live := []string{}
	next := 1
	for ; next <= cfg.Consumers; next++ {
		name := fmt.Sprintf("c%d", next)
		live = append(live, name)
		out = append(out, Action{At: 0, Op: OpInitial, Target: name})
	}
	type pending struct {
		at   time.Duration
		name string
	}
	var restarts []pending // instances down, back at .at
	members := func() int { return len(live) + len(restarts) }
	end := cfg.Duration - quiet
	for t := uniform(2*time.Second, 4*time.Second); t < end && total > 0; t += uniform(cfg.MinGap, cfg.MaxGap) {
		calm, calmStart := calmAt(t)
		if calm && t < calmStart+cfg.CalmAfter {
			t = calmStart + cfg.CalmAfter
			if t >= end {
				break
			}
		}
		// Instances whose restart is due are live again.
		kept := restarts[:0]
		for _, r := range restarts {
			if r.at <= t {
				live = append(live, r.name)
			} else {
				kept = append(kept, r)
			}
		}
		restarts = kept
		sort.Slice(live, func(i, j int) bool { return instanceNumber(live[i]) < instanceNumber(live[j]) })

		// Draw a kind that can happen now.
		var kind Kind
		for attempt := 0; attempt < 20 && kind == ""; attempt++ {
			if calm && gracefulTotal == 0 {
				break
			}
			weight := func(k Kind) int {
				if calm && !graceful(k) {
					return 0
				}
				return cfg.Mix[k]
			}
			sum := total
			if calm {
				sum = gracefulTotal
			}
			r := rng.IntN(sum)
			for _, k := range Kinds {
				if r < weight(k) {
					kind = k
					break
				}
				r -= weight(k)
			}
			switch kind {
			case Join:
				if members() >= cfg.MaxConsumers {
					kind = ""
				}
			case Leave:
				if len(live) <= 1 || members() <= 1 {
					kind = ""
				}
			case BrokerRestart:
			default:
				if len(live) == 0 {
					kind = ""
				}
			}
		}
		if kind == "" {
			continue
		}
		id++
		a := Action{At: t, Op: Op(kind), Kind: kind, ID: id}
		if kind != BrokerRestart && kind != Join {
			a.Target = live[rng.IntN(len(live))]
		}
		clip := func(d time.Duration) time.Duration { return min(d, stormEnd(t)-t) }
		switch kind {
		case SIGKILL, SIGTERM:
			a.For = uniform(200*time.Millisecond, 3*time.Second)
			live = slices.DeleteFunc(live, func(s string) bool { return s == a.Target })
			restarts = append(restarts, pending{at: t + a.For, name: a.Target})
			out = append(out, a, Action{At: t + a.For, Op: OpStart, Kind: kind, Target: a.Target, ID: id})
			continue
		case Join:
			a.Target = fmt.Sprintf("c%d", next)
			next++
			live = append(live, a.Target)
		case Leave:
			live = slices.DeleteFunc(live, func(s string) bool { return s == a.Target })
		case Latency:
			a.Latency = uniform(20*time.Millisecond, 250*time.Millisecond)
			a.Jitter = a.Latency / 2
			a.For = clip(uniform(2*time.Second, 10*time.Second))
		case Reset:
			a.Probability = 0.02 + 0.2*rng.Float64()
			a.For = clip(uniform(time.Second, 6*time.Second))
		case Blackhole:
			// Up to past the session timeout: the instance is dropped from
			// the group while it still believes it owns its partitions.
			a.For = clip(uniform(time.Second, SessionTimeout+4*time.Second))
		case CommitDelay:
			a.Delay = RequestTimeout + uniform(500*time.Millisecond, 2*time.Second)
			a.For = clip(uniform(2*time.Second, 8*time.Second))
		case CommitError:
			a.Code = commitCodes[rng.IntN(len(commitCodes))]
			a.Probability = 0.3 + 0.7*rng.Float64()
			a.For = clip(uniform(2*time.Second, 8*time.Second))
		case BrokerRestart:
			// The in-process broker stops and starts at once: keep it down
			// a moment. The real one takes seconds each way by itself.
			a.Kill = cfg.BrokerKill && rng.IntN(2) == 0
			if !cfg.BrokerKill {
				a.For = uniform(0, 2*time.Second)
			}
		}
		out = append(out, a)
		switch kind {
		case Latency, Reset, Blackhole, CommitDelay, CommitError:
			out = append(out, Action{At: t + a.For, Op: OpEnd, Kind: kind, Target: a.Target, ID: id})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out, nil
}

// instanceNumber is 3 for "c3".
func instanceNumber(name string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(name, "c"))
	return n
}
