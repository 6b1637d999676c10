package chaos

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// base is the synthetic runs' time zero.
var base = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).UnixNano()

func at(d time.Duration) int64 { return base + int64(d) }

// synth builds a checker Input by hand: a topic whose log holds the
// producer's values at every offset, consumer processes, faults.
type synth struct {
	in      Input
	ledgers map[Inc]*Ledger
}

func newSynth(partitions int, perPart int64) *synth {
	s := &synth{ledgers: map[Inc]*Ledger{}}
	s.in = Input{Topic: "t", Partitions: partitions, Margin: 2 * time.Second}
	for p := 0; p < partitions; p++ {
		var log []string
		for o := int64(0); o < perPart; o++ {
			log = append(log, string(Value(p, o)))
		}
		s.in.Log = append(s.in.Log, log)
		s.in.Acked = append(s.in.Acked, perPart)
	}
	return s
}

// proc adds an incarnation alive over [start, end], ended as told.
func (s *synth) proc(inc Inc, start, end time.Duration, ended EndKind) *Incarnation {
	s.in.Incarnations = append(s.in.Incarnations, Incarnation{Inc: inc, Start: at(start), End: at(end), Ended: ended})
	return &s.in.Incarnations[len(s.in.Incarnations)-1]
}

// handle records inc handling offsets [from, to) of p in gen, one every
// millisecond from t, and a G line for gen just before.
func (s *synth) handle(inc Inc, gen int32, p int, from, to int64, t time.Duration) {
	l := s.ledgers[inc]
	if l == nil {
		l = &Ledger{Path: inc.String()}
		s.ledgers[inc] = l
	}
	if n := len(l.Gens); n == 0 || l.Gens[n-1].Gen != gen {
		l.Gens = append(l.Gens, GenEvent{T: at(t) - int64(time.Millisecond), Gen: gen, Member: "m-" + inc.Instance})
	}
	for o := from; o < to; o++ {
		l.Handlings = append(l.Handlings, Handling{
			T: at(t + time.Duration(o-from)*time.Millisecond), Topic: "t", Partition: p, Offset: o,
			Value: string(Value(p, o)), Inc: inc, Gen: gen,
		})
	}
}

func (s *synth) commit(p int, t time.Duration, committed int64) {
	s.in.Commits = append(s.in.Commits, CommitSample{T: at(t), Partition: p, Committed: committed, End: int64(len(s.in.Log[p]))})
}

func (s *synth) fault(kind Kind, target string, start, end time.Duration) {
	s.in.Faults = append(s.in.Faults, Fault{ID: len(s.in.Faults) + 1, Kind: kind, Target: target, Start: at(start), End: at(end)})
}

func (s *synth) check(t *testing.T) *Report {
	t.Helper()
	for _, l := range s.ledgers {
		s.in.Ledgers = append(s.in.Ledgers, *l)
	}
	r := Check(&s.in)
	var b bytes.Buffer
	r.WriteTable(&b)
	t.Logf("\n%s", b.String())
	return r
}

// wantViolations fails unless the report holds exactly these violation
// counts.
func wantViolations(t *testing.T, r *Report, want map[string]int64) {
	t.Helper()
	for k, n := range want {
		if r.Violations[k] != n {
			t.Errorf("violation %q: %d, want %d", k, r.Violations[k], n)
		}
	}
	for k, n := range r.Violations {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected violation %q: %d (%v)", k, n, r.Examples[k])
		}
	}
	if r.Failed() != (len(want) > 0) {
		t.Errorf("Failed() = %v with violations %v", r.Failed(), r.Violations)
	}
}

var (
	a1 = Inc{"c1", 1}
	a2 = Inc{"c1", 2}
	b1 = Inc{"c2", 1}
	c1 = Inc{"c3", 1}
)

// A clean hand-off: c1 handles 0..9 in generation 1, stops gracefully, c2
// resumes at 10.
func cleanRun() *synth {
	s := newSynth(1, 20)
	s.proc(a1, 0, 2*time.Second, EndSIGTERM)
	s.proc(b1, 0, 5*time.Second, EndSIGTERM)
	s.handle(a1, 1, 0, 0, 10, 100*time.Millisecond)
	s.commit(0, time.Second, 10)
	s.handle(b1, 2, 0, 10, 20, 3*time.Second)
	s.commit(0, 4*time.Second, 20)
	return s
}

func TestCheckClean(t *testing.T) {
	r := cleanRun().check(t)
	wantViolations(t, r, nil)
	if r.Consumed != 20 || r.Handled != 20 || r.DuplicatesTotal() != 0 || r.Handoffs != 1 || r.CleanHandoffs != 1 {
		t.Fatalf("consumed %d handled %d dups %d hand-offs %d clean %d, want 20 20 0 1 1",
			r.Consumed, r.Handled, r.DuplicatesTotal(), r.Handoffs, r.CleanHandoffs)
	}
}

func TestCheckLost(t *testing.T) {
	s := cleanRun()
	l := s.ledgers[b1]
	l.Handlings = append(l.Handlings[:4], l.Handlings[5:]...) // offset 14 never handled
	r := s.check(t)
	wantViolations(t, r, map[string]int64{VLost: 1})
	if r.Lost() != 1 || !strings.Contains(r.Examples[VLost][0], "t/0@14") {
		t.Fatalf("lost %d %v, want t/0@14", r.Lost(), r.Examples[VLost])
	}
}

// The next owner starts two offsets early after a graceful stop with no
// fault anywhere: a duplicate at a clean hand-off.
func TestCheckGracefulDuplicate(t *testing.T) {
	s := newSynth(1, 20)
	s.proc(a1, 0, 2*time.Second, EndSIGTERM)
	s.proc(b1, 0, 5*time.Second, EndSIGTERM)
	s.handle(a1, 1, 0, 0, 10, 100*time.Millisecond)
	s.handle(b1, 2, 0, 8, 20, 3*time.Second)
	r := s.check(t)
	wantViolations(t, r, map[string]int64{VGraceful: 2})
	if r.Duplicates[CauseGraceful] != 2 || r.CleanHandoffs != 1 {
		t.Fatalf("graceful duplicates %d, clean hand-offs %d; want 2, 1", r.Duplicates[CauseGraceful], r.CleanHandoffs)
	}
}

// The same two duplicates after c1 was SIGKILLed, with Kafka's commit at 8:
// attributed to the kill, within its bound.
func TestCheckSigkillDuplicatesWithinBound(t *testing.T) {
	s := newSynth(1, 20)
	inc := s.proc(a1, 0, time.Second, EndSIGKILL)
	inc.KillDurable = map[int]int64{0: 9}
	s.proc(b1, 0, 5*time.Second, EndSIGTERM)
	s.handle(a1, 1, 0, 0, 10, 100*time.Millisecond)
	s.commit(0, 500*time.Millisecond, 8)
	s.handle(b1, 2, 0, 8, 20, 3*time.Second)
	r := s.check(t)
	wantViolations(t, r, nil)
	if r.Duplicates[Cause(SIGKILL)] != 2 || r.SigkillBound != 2 || r.Unflushed != 1 || r.SigkillDurable != 1 || r.Kills != 1 {
		t.Fatalf("sigkill duplicates %d bound %d unflushed %d durable %d kills %d, want 2 2 1 1 1",
			r.Duplicates[Cause(SIGKILL)], r.SigkillBound, r.Unflushed, r.SigkillDurable, r.Kills)
	}
}

// After a SIGKILL the next owner starts below Kafka's committed offset:
// beyond the bound, and below the commit.
func TestCheckSigkillBeyondBound(t *testing.T) {
	s := newSynth(1, 20)
	s.proc(a1, 0, time.Second, EndSIGKILL)
	s.proc(b1, 0, 5*time.Second, EndSIGTERM)
	s.handle(a1, 1, 0, 0, 10, 100*time.Millisecond)
	s.commit(0, 500*time.Millisecond, 9)
	s.handle(b1, 2, 0, 7, 20, 3*time.Second)
	r := s.check(t)
	wantViolations(t, r, map[string]int64{VBelowCommitted: 2, VSigkillBound: 1})
	if r.Duplicates[Cause(SIGKILL)] != 3 {
		t.Fatalf("sigkill duplicates %d, want 3", r.Duplicates[Cause(SIGKILL)])
	}
}

// Every fault kind is bounded like a SIGKILL: a blackhole on c1 excuses
// the two duplicates c1 had handled at or above Kafka's commit (8) when c2
// began, and no more. Starting at 7 under a commit at 9 is three, beyond the
// bound of one: a broken promise, besides the handling below the commit.
func TestCheckFaultDuplicatesBounded(t *testing.T) {
	for _, tc := range []struct {
		name            string
		committed, from int64
		want            map[string]int64
		dups, bound     int64
	}{
		{"within", 8, 8, nil, 2, 2},
		{"beyond", 9, 7, map[string]int64{VBelowCommitted: 2, VFaultBound: 1}, 3, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSynth(1, 20)
			s.proc(a1, 0, 200*time.Second, EndSIGTERM)
			s.proc(b1, 0, 200*time.Second, EndSIGTERM)
			s.fault(Blackhole, "c1", 99*time.Second, 101*time.Second)
			s.handle(a1, 7, 0, 0, 10, 100*time.Second)
			s.commit(0, 100500*time.Millisecond, tc.committed)
			s.handle(b1, 8, 0, tc.from, 20, 103*time.Second)
			r := s.check(t)
			wantViolations(t, r, tc.want)
			if r.Duplicates[Cause(Blackhole)] != tc.dups || r.FaultBound[Cause(Blackhole)] != tc.bound {
				t.Fatalf("blackhole duplicates %d bound %d, want %d %d", r.Duplicates[Cause(Blackhole)], r.FaultBound[Cause(Blackhole)], tc.dups, tc.bound)
			}
			var b bytes.Buffer
			r.WriteTable(&b)
			if want := fmt.Sprintf("bound %d (handled by the previous owners", tc.bound); !strings.Contains(b.String(), want) {
				t.Fatalf("the table does not say %q:\n%s", want, b.String())
			}
		})
	}
}

// A fault excuses only what was handled while its effects lasted: a
// blackhole on c1 early in its ownership (10-20 s, Margin 2 s) excuses the
// repeat of offsets 3 and 4, which c1 handled at 15 s, not of 5..9, which it
// handled at 100 s, long after: their commit was not held up by it.
func TestCheckFaultExcusesOnlyItsWindow(t *testing.T) {
	s := newSynth(1, 20)
	s.proc(a1, 0, 200*time.Second, EndSIGTERM)
	s.proc(b1, 0, 200*time.Second, EndSIGTERM)
	s.fault(Blackhole, "c1", 10*time.Second, 20*time.Second)
	s.handle(a1, 7, 0, 0, 5, 15*time.Second)
	s.handle(a1, 7, 0, 5, 10, 100*time.Second)
	s.handle(b1, 8, 0, 3, 20, 103*time.Second)
	r := s.check(t)
	wantViolations(t, r, map[string]int64{VFaultWindow: 5})
	if r.Duplicates[Cause(Blackhole)] != 7 {
		t.Fatalf("duplicates %v, want 7 attributed to the blackhole", r.Duplicates)
	}
	if e := r.Examples[VFaultWindow]; len(e) == 0 || !strings.Contains(e[0], "t/0@5") {
		t.Fatalf("examples %v, want t/0@5 first", e)
	}
}

// A kill long after c1 had handed the partition off gracefully (it had
// moved to a later generation) does not excuse the duplicate.
func TestCheckKillAfterGracefulHandoffIsNoExcuse(t *testing.T) {
	s := newSynth(2, 20)
	s.proc(a1, 0, 2500*time.Millisecond, EndSIGKILL)
	s.proc(b1, 0, 5*time.Second, EndSIGTERM)
	s.handle(a1, 1, 0, 0, 10, 100*time.Millisecond)
	s.handle(a1, 2, 1, 0, 5, 2*time.Second) // generation 2, another partition
	s.handle(b1, 2, 0, 8, 20, 3*time.Second)
	s.handle(b1, 3, 1, 5, 20, 4*time.Second)
	r := s.check(t)
	wantViolations(t, r, map[string]int64{VGraceful: 2})
}

// Cooperative rebalancing: c1 keeps partition 0 through a rebalance
// (generation 2 starts while it owns it) and is killed before it handles
// it again; c2 gets it in generation 3. The kill explains the duplicates.
func TestCheckKillAfterKeptPartition(t *testing.T) {
	s := newSynth(1, 20)
	s.proc(a1, 0, 1200*time.Millisecond, EndSIGKILL)
	s.proc(b1, 0, 5*time.Second, EndSIGTERM)
	s.handle(a1, 1, 0, 0, 10, 100*time.Millisecond)
	s.ledgers[a1].Gens = append(s.ledgers[a1].Gens, GenEvent{T: at(time.Second), Gen: 2, Member: "m-c1"})
	s.commit(0, 500*time.Millisecond, 8)
	s.handle(b1, 3, 0, 8, 20, 3*time.Second)
	r := s.check(t)
	wantViolations(t, r, nil)
	if r.Duplicates[Cause(SIGKILL)] != 2 {
		t.Fatalf("sigkill duplicates %d, want 2", r.Duplicates[Cause(SIGKILL)])
	}
}

// Static membership: c1#1 is killed in generation 2 and its restart c1#2
// is handed its assignment in that same generation, without a rebalance.
// The kill explains the duplicates.
func TestCheckStaticRestartSameGeneration(t *testing.T) {
	s := newSynth(1, 20)
	s.proc(a1, 0, 1200*time.Millisecond, EndSIGKILL)
	s.proc(a2, 1500*time.Millisecond, 5*time.Second, EndSIGTERM)
	s.handle(a1, 1, 0, 0, 10, 100*time.Millisecond)
	s.ledgers[a1].Gens = append(s.ledgers[a1].Gens, GenEvent{T: at(time.Second), Gen: 2, Member: "m-c1"})
	s.commit(0, 500*time.Millisecond, 8)
	s.handle(a2, 2, 0, 8, 20, 3*time.Second)
	r := s.check(t)
	wantViolations(t, r, nil)
	if r.Duplicates[Cause(SIGKILL)] != 2 {
		t.Fatalf("sigkill duplicates %d, want 2", r.Duplicates[Cause(SIGKILL)])
	}
}

// Offsets going backwards in one process: a duplicate by the same process
// too.
func TestCheckBackwards(t *testing.T) {
	s := newSynth(1, 10)
	s.proc(a1, 0, 2*time.Second, EndSIGTERM)
	s.handle(a1, 1, 0, 0, 6, 100*time.Millisecond)
	s.handle(a1, 1, 0, 3, 10, 200*time.Millisecond)
	r := s.check(t)
	wantViolations(t, r, map[string]int64{VBackwards: 1, VSameProcess: 3})
	if !strings.Contains(r.Examples[VBackwards][0], "without a reassignment") {
		t.Fatalf("backwards example %q should say without a reassignment", r.Examples[VBackwards][0])
	}
}

// A fault explains a duplicate only on the previous owner's path (or the
// broker), and only near its ownership.
func TestCheckFaultScope(t *testing.T) {
	run := func(kind Kind, target string, start, end time.Duration, more func(*synth)) *Report {
		s := newSynth(1, 20)
		s.proc(a1, 0, 2*time.Second, EndSIGTERM)
		s.proc(b1, 0, 5*time.Second, EndSIGTERM)
		s.proc(c1, 0, 5*time.Second, EndSIGTERM)
		s.fault(kind, target, start, end)
		if more != nil {
			more(s)
		}
		s.handle(a1, 7, 0, 0, 10, 100*time.Second)
		s.handle(b1, 8, 0, 8, 20, 103*time.Second)
		return s.check(t)
	}
	for _, tc := range []struct {
		name         string
		kind         Kind
		target       string
		start, end   time.Duration
		wantCause    Cause
		wantViolated bool
	}{
		{"commit errors on the previous owner", CommitError, "c1", 99 * time.Second, 101 * time.Second, Cause(CommitError), false},
		{"commit errors on a bystander", CommitError, "c3", 99 * time.Second, 101 * time.Second, CauseGraceful, true},
		{"commit errors on the next owner", CommitError, "c2", 99 * time.Second, 101 * time.Second, CauseGraceful, true},
		{"broker restart", BrokerRestart, "", 101 * time.Second, 102 * time.Second, Cause(BrokerRestart), false},
		{"blackhole ended within the margin", Blackhole, "c1", 90 * time.Second, 98500 * time.Millisecond, Cause(Blackhole), false},
		{"blackhole ended long before", Blackhole, "c1", 10 * time.Second, 20 * time.Second, CauseGraceful, true},
		{"latency after the hand-off", Latency, "c1", 104 * time.Second, 110 * time.Second, CauseGraceful, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(tc.kind, tc.target, tc.start, tc.end, nil)
			if r.Duplicates[tc.wantCause] != 2 {
				t.Fatalf("duplicates %v, want 2 attributed to %s", r.Duplicates, tc.wantCause)
			}
			if got := r.Violations[VGraceful] > 0; got != tc.wantViolated {
				t.Fatalf("graceful violation %v, want %v", got, tc.wantViolated)
			}
		})
	}
}

// A fault in force during the ownership explains a duplicate before one
// that only reaches it through the margin, whatever their priority.
func TestCheckFaultInForceFirst(t *testing.T) {
	s := newSynth(1, 20)
	s.proc(a1, 0, 2*time.Second, EndSIGTERM)
	s.proc(b1, 0, 5*time.Second, EndSIGTERM)
	s.fault(Reset, "c1", 95*time.Second, 98*time.Second)        // ended before c1's ownership, within the margin
	s.fault(CommitDelay, "c1", 99*time.Second, 101*time.Second) // in force during it
	s.handle(a1, 7, 0, 0, 10, 100*time.Second)
	s.handle(b1, 8, 0, 8, 20, 103*time.Second)
	r := s.check(t)
	if r.Duplicates[Cause(CommitDelay)] != 2 {
		t.Fatalf("duplicates %v, want 2 attributed to commit-delay", r.Duplicates)
	}
}

// A zombie: c2, still in generation 7, handles offsets that c1 already
// handled in generation 8, at the same time. A commit held on c2's own
// connection (its heartbeats wait behind it, so it has not learned of the
// new generation) explains it; a fault on anyone else does not.
func TestCheckZombieOwner(t *testing.T) {
	for _, tc := range []struct {
		name      string
		target    string
		wantCause Cause
	}{
		{"commit held on the zombie", "c2", Cause(CommitDelay)},
		{"commit held on the new owner", "c1", CauseGraceful},
		{"no fault", "", CauseGraceful},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSynth(1, 20)
			s.proc(a1, 0, 200*time.Second, EndSIGTERM)
			s.proc(b1, 0, 200*time.Second, EndSIGTERM)
			if tc.target != "" {
				s.fault(CommitDelay, tc.target, 99*time.Second, 101*time.Second)
			}
			s.handle(b1, 7, 0, 0, 12, 99*time.Second)
			s.handle(a1, 8, 0, 10, 20, 100*time.Second)
			s.handle(b1, 7, 0, 12, 14, 100*time.Second+2500*time.Microsecond)
			r := s.check(t)
			if r.Duplicates[tc.wantCause] != 4 {
				t.Fatalf("duplicates %v, want 4 attributed to %s", r.Duplicates, tc.wantCause)
			}
			if got := r.Violations[VGraceful] > 0; got != (tc.wantCause == CauseGraceful) {
				t.Fatalf("graceful violation %v", got)
			}
		})
	}
}

// c1 gave its partition up without a commit (an L line: its lease ran out
// while a rebalance was held up) after handling 8 and 9, and c2 handled
// them again. A fault on any process during the session before the loss
// explains it (here c3, cut off, held the rebalance up); a fault long
// before, or none, does not; nor does a fault on a bystander without the
// loss (TestCheckFaultScope).
func TestCheckMembershipLapsed(t *testing.T) {
	for _, tc := range []struct {
		name       string
		lost       bool
		kind       Kind
		start, end time.Duration
		wantCause  Cause
	}{
		{"bystander cut off", true, Blackhole, 97 * time.Second, 102 * time.Second, Cause(Blackhole)},
		{"bystander killed", true, SIGKILL, 96 * time.Second, 98 * time.Second, Cause(SIGKILL)},
		{"bystander cut off long before", true, Blackhole, 10 * time.Second, 20 * time.Second, CauseGraceful},
		{"no fault", true, "", 0, 0, CauseGraceful},
		{"no loss recorded", false, Blackhole, 97 * time.Second, 102 * time.Second, CauseGraceful},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSynth(1, 20)
			s.proc(a1, 0, 200*time.Second, EndSIGTERM)
			s.proc(b1, 0, 200*time.Second, EndSIGTERM)
			s.proc(c1, 0, 200*time.Second, EndSIGTERM)
			if tc.kind != "" {
				s.fault(tc.kind, "c3", tc.start, tc.end)
			}
			s.handle(a1, 7, 0, 0, 10, 100*time.Second)
			if tc.lost {
				l := s.ledgers[a1]
				l.Lost = append(l.Lost, at(101*time.Second))
			}
			s.handle(b1, 9, 0, 8, 20, 103*time.Second)
			r := s.check(t)
			if r.Duplicates[tc.wantCause] != 2 {
				t.Fatalf("duplicates %v, want 2 attributed to %s", r.Duplicates, tc.wantCause)
			}
			if got := r.Violations[VGraceful] > 0; got != (tc.wantCause == CauseGraceful) {
				t.Fatalf("graceful violation %v", got)
			}
		})
	}
}

func TestCheckBelowOwnFile(t *testing.T) {
	s := newSynth(1, 10)
	s.proc(a1, 0, time.Second, EndSIGKILL)
	inc := s.proc(a2, 2*time.Second, 5*time.Second, EndSIGTERM)
	inc.StartWatermarks = map[int]int64{0: 8}
	s.handle(a1, 1, 0, 0, 8, 100*time.Millisecond)
	s.handle(a2, 2, 0, 6, 10, 3*time.Second)
	r := s.check(t)
	wantViolations(t, r, map[string]int64{VBelowOwnFile: 2})
}

// With a changelog, a process whose file another owner overtook (a marker
// at or after the file's last acknowledged changelog write, before the
// process handled the partition) resumes from Kafka's committed offset,
// below its file: counted, not a broken promise. c1#1 is killed with its
// file at 8 and its changelog position at 5; Kafka's committed offset is
// 6; c1#2 starts on the file at 2s, writes its own marker (producer 2) at
// 2.9s and handles 6 and 7 again from 3s.
func TestCheckBelowOwnFileAfterRestore(t *testing.T) {
	marker := func(offset int64, d time.Duration, producer int64) ChangelogMarker {
		return ChangelogMarker{Partition: 0, Offset: offset, T: at(d), Start: 6, Producer: producer}
	}
	own := marker(6, 2900*time.Millisecond, 2)
	for _, tc := range []struct {
		name    string
		state   bool
		next    int64 // the file's changelog position at the start; -1: none
		markers []ChangelogMarker
		excuse  bool
	}{
		{"another owner's marker before the start", true, 5, []ChangelogMarker{marker(5, 1500*time.Millisecond, 1), own}, true},
		{"another owner's marker after the start", true, 5, []ChangelogMarker{marker(5, 2500*time.Millisecond, 1), own}, true},
		{"a marker before the start, none of the process's", true, 5, []ChangelogMarker{marker(5, 1500*time.Millisecond, 1)}, true},
		{"no marker", true, 5, nil, false},
		{"the process's own marker only", true, 5, []ChangelogMarker{own}, false},
		{"the process's own markers only", true, 5, []ChangelogMarker{marker(5, 2200*time.Millisecond, 2), own}, false},
		{"another owner's marker after the handling began", true, 5, []ChangelogMarker{marker(5, 2900*time.Millisecond, 2), marker(6, 3500*time.Millisecond, 1)}, false},
		{"another owner's marker below the position", true, 5, []ChangelogMarker{marker(4, 1500*time.Millisecond, 1), own}, false},
		{"a marker less than a millisecond before the start", true, 5, []ChangelogMarker{marker(5, 2*time.Second-500*time.Microsecond, 1)}, false},
		{"no position in the file", true, -1, []ChangelogMarker{marker(5, 1500*time.Millisecond, 1), own}, false},
		{"without state", false, 5, []ChangelogMarker{marker(5, 1500*time.Millisecond, 1), own}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSynth(1, 10)
			s.in.State, s.in.ChangelogMarkers = tc.state, tc.markers
			s.proc(a1, 0, time.Second, EndSIGKILL)
			inc := s.proc(a2, 2*time.Second, 5*time.Second, EndSIGTERM)
			inc.StartWatermarks = map[int]int64{0: 8}
			if tc.next >= 0 {
				inc.StartChangelogNext = map[int]int64{0: tc.next}
			}
			s.handle(a1, 1, 0, 0, 8, 100*time.Millisecond)
			s.commit(0, 500*time.Millisecond, 6)
			s.handle(a2, 2, 0, 6, 10, 3*time.Second)
			r := s.check(t)
			want, restored := map[string]int64{VBelowOwnFile: 2}, int64(0)
			if tc.excuse {
				want, restored = nil, 2
			}
			wantViolations(t, r, want)
			if r.RestoredBelowFile != restored {
				t.Errorf("re-handled after a restore: %d, want %d", r.RestoredBelowFile, restored)
			}
			if r.Duplicates[Cause(SIGKILL)] != 2 {
				t.Errorf("duplicates %v, want 2 after the SIGKILL", r.Duplicates)
			}
		})
	}
}

// The exception covers the file's own watermark only: below Kafka's
// committed offset, and beyond the SIGKILL's bound, is broken still.
func TestCheckBelowOwnFileAfterRestoreBelowCommitted(t *testing.T) {
	s := newSynth(1, 10)
	s.in.State = true
	s.proc(a1, 0, time.Second, EndSIGKILL)
	inc := s.proc(a2, 2*time.Second, 5*time.Second, EndSIGTERM)
	inc.StartWatermarks, inc.StartChangelogNext = map[int]int64{0: 8}, map[int]int64{0: 5}
	s.in.ChangelogMarkers = []ChangelogMarker{
		{Partition: 0, Offset: 5, T: at(1500 * time.Millisecond), Start: 6, Producer: 1},
		{Partition: 0, Offset: 6, T: at(2900 * time.Millisecond), Start: 5, Producer: 2},
	}
	s.handle(a1, 1, 0, 0, 8, 100*time.Millisecond)
	s.commit(0, 500*time.Millisecond, 6)
	s.handle(a2, 2, 0, 5, 10, 3*time.Second)
	r := s.check(t)
	wantViolations(t, r, map[string]int64{VBelowCommitted: 1, VSigkillBound: 1})
	if r.RestoredBelowFile != 3 {
		t.Errorf("re-handled after a restore: %d, want 3", r.RestoredBelowFile)
	}
}

func TestCheckCommittedOffsets(t *testing.T) {
	s := cleanRun()
	s.commit(0, 4500*time.Millisecond, 15) // decreased from 20
	s.commit(0, 4600*time.Millisecond, 25) // beyond the log end (20)
	s.in.Files = []FileWatermark{{Instance: "c1", Partition: 0, Watermark: 21}, {Instance: "c2", Partition: 0, Watermark: 20}}
	r := s.check(t)
	wantViolations(t, r, map[string]int64{VCommitDecreased: 1, VCommitBeyondEnd: 1, VFileBeyondEnd: 1})
}

func TestCheckValuesAndBrokerLoss(t *testing.T) {
	s := cleanRun()
	s.ledgers[b1].Handlings[2].Value = "p0-s000000999"
	s.in.Acked[0] = 21 // the producer had an acknowledgement for sequence 20, not in the log
	r := s.check(t)
	wantViolations(t, r, map[string]int64{VValue: 1, VBrokerLost: 1})
}

func TestCheckProcesses(t *testing.T) {
	s := newSynth(1, 20)
	inc := s.proc(a1, 0, 2*time.Second, EndCrashed)
	inc.ExitErr = "exit status 2"
	s.proc(b1, 0, 5*time.Second, EndFailed).ExitErr = "exit status 1"
	s.handle(a1, 1, 0, 0, 10, 100*time.Millisecond)
	s.handle(b1, 2, 0, 9, 20, 3*time.Second)
	r := s.check(t)
	wantViolations(t, r, map[string]int64{VConsumerCrashed: 1, VGracefulStopFail: 1, VCrashDuplicate: 1})
	if r.Duplicates[CauseCrash] != 1 {
		t.Fatalf("crash duplicates %d, want 1", r.Duplicates[CauseCrash])
	}
}

// With Keys, a process handles a partition's keys concurrently: offsets
// go back across keys (no violation) but never within a key.
func TestCheckKeyOrder(t *testing.T) {
	for _, tc := range []struct {
		name  string
		order []int64 // offsets in the order the calls began
		want  bool    // a backwards violation
	}{
		{"across keys", []int64{1, 0, 3, 2, 5, 4}, false}, // keys 0,1: 0<2<4 and 1<3<5
		{"within a key", []int64{0, 1, 4, 3, 2, 5}, true}, // key 0: 4 then 2
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSynth(1, 6)
			s.in.Keys = 2
			inc := Inc{Instance: "c1", Run: 1}
			s.proc(inc, 0, time.Minute, EndSIGTERM)
			l := &Ledger{Path: inc.String(), Gens: []GenEvent{{T: at(0), Gen: 1, Member: "m"}}}
			for i, o := range tc.order {
				l.Handlings = append(l.Handlings, Handling{T: at(time.Duration(i+1) * time.Millisecond), Topic: "t", Partition: 0,
					Offset: o, Value: string(Value(0, o)), Inc: inc, Gen: 1})
			}
			s.ledgers[inc] = l
			r := s.check(t)
			got := r.Violations[VBackwards] > 0
			if got != tc.want {
				t.Fatalf("backwards violation %v, want %v: %v", got, tc.want, r.Violations)
			}
			if len(r.Violations) > 0 && !tc.want {
				t.Fatalf("violations: %v", r.Violations)
			}
		})
	}
}

// txnRun is one partition written by both producers: plain records,
// a committed transaction, an aborted one, and one of unknown outcome,
// with markers between. handled lists the offsets c1 handles.
func txnRun(handled ...int64) *synth {
	s := newSynth(1, 0)
	log := []string{
		string(Value(0, 0)), string(Value(0, 1)), // 0-1
		string(TxnValue(0, 0)), string(TxnValue(0, 1)), markerValue, // 2-4: committed
		string(TxnValue(0, 2)), string(TxnValue(0, 3)), markerValue, // 5-7: aborted
		string(Value(0, 2)),                 // 8
		string(TxnValue(0, 4)), markerValue, // 9-10: unknown
	}
	s.in.Log, s.in.Acked = [][]string{log}, []int64{3}
	s.in.Txn = map[string]TxnOutcome{
		string(TxnValue(0, 0)): TxnCommitted, string(TxnValue(0, 1)): TxnCommitted,
		string(TxnValue(0, 2)): TxnAborted, string(TxnValue(0, 3)): TxnAborted,
		string(TxnValue(0, 4)): TxnUnknown,
	}
	s.proc(a1, 0, 2*time.Second, EndSIGTERM)
	l := &Ledger{Path: a1.String(), Gens: []GenEvent{{T: at(0), Gen: 1, Member: "m-c1"}}}
	for i, o := range handled {
		v := "a marker's value"
		if log[o] != markerValue {
			v = log[o]
		}
		l.Handlings = append(l.Handlings, Handling{T: at(time.Duration(i+1) * time.Millisecond), Topic: "t", Partition: 0, Offset: o, Value: v, Inc: a1, Gen: 1})
	}
	s.ledgers[a1] = l
	return s
}

func TestCheckTransactions(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handled []int64
		want    map[string]int64
	}{
		{"committed and plain records once", []int64{0, 1, 2, 3, 8}, nil},
		{"a record of unknown outcome may be handled", []int64{0, 1, 2, 3, 8, 9}, nil},
		{"an aborted record handled", []int64{0, 1, 2, 3, 5, 8}, map[string]int64{VAborted: 1}},
		{"a committed record lost", []int64{0, 1, 2, 8}, map[string]int64{VLost: 1}},
		{"a marker handled", []int64{0, 1, 2, 3, 4, 8}, map[string]int64{VMarker: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := txnRun(tc.handled...).check(t)
			wantViolations(t, r, tc.want)
			if r.Markers != 3 || r.TxnCommitted != 2 || r.TxnAborted != 2 || r.TxnUnknown != 1 {
				t.Errorf("markers %d, committed %d, aborted %d, unknown %d; want 3, 2, 2, 1", r.Markers, r.TxnCommitted, r.TxnAborted, r.TxnUnknown)
			}
		})
	}
	s := txnRun(0, 1, 2, 3, 8)
	s.in.Txn[string(TxnValue(0, 9))] = TxnCommitted // committed, never in the log
	wantViolations(t, s.check(t), map[string]int64{VBrokerLost: 1})
}

// The broker's log decides a transaction's outcome: a commit the producer
// was told of but the log aborts (Kafka 4.4.0 lost a transaction's commit
// markers at a clean restart, and the next transaction's abort marker
// aborted its records) must not be handled, and is counted as the
// broker's; an outcome unknown to the producer is the log's.
func TestCheckTransactionsTheLogDecides(t *testing.T) {
	committedInLog := func(s *synth, values ...int) {
		s.in.LogCommitted = map[string]bool{}
		for _, v := range values {
			s.in.LogCommitted[string(TxnValue(0, int64(v)))] = true
		}
	}
	for _, tc := range []struct {
		name           string
		handled        []int64
		committed      []int // transactional values the log commits
		want           map[string]int64
		aborted        int64 // committed by the producer, aborted by the log
		committedByLog int64
	}{
		{"the log agrees", []int64{0, 1, 2, 3, 8}, []int{0, 1}, nil, 0, 0},
		{"a commit the log aborts is not lost", []int64{0, 1, 2, 8}, []int{0}, nil, 1, 0},
		{"a commit the log aborts must not be handled", []int64{0, 1, 2, 3, 8}, []int{0}, map[string]int64{VAborted: 1}, 1, 0},
		{"an abort the log commits must be handled", []int64{0, 1, 2, 3, 8}, []int{0, 1, 2}, map[string]int64{VLost: 1}, 0, 1},
		{"an unknown outcome the log commits must be handled", []int64{0, 1, 2, 3, 8}, []int{0, 1, 4}, map[string]int64{VLost: 1}, 0, 0},
		{"an unknown outcome the log aborts must not be handled", []int64{0, 1, 2, 3, 8, 9}, []int{0, 1}, map[string]int64{VAborted: 1}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := txnRun(tc.handled...)
			committedInLog(s, tc.committed...)
			r := s.check(t)
			wantViolations(t, r, tc.want)
			if r.BrokerAborted != tc.aborted || r.BrokerCommitted != tc.committedByLog {
				t.Errorf("broker aborted %d, committed %d; want %d, %d (%v)", r.BrokerAborted, r.BrokerCommitted, tc.aborted, tc.committedByLog, r.BrokerExamples)
			}
		})
	}
}

// With state (Config.State), every file at a partition's log end must hold
// the log's count under each key: the messages to handle (plain and
// committed transactional records; never an aborted one or a marker),
// whatever the ledgers show handled twice. A file below the end is not
// held to it, but some file must reach the end.
func TestCheckState(t *testing.T) {
	right := map[int64]int64{0: 1, 1: 1, 2: 1, 3: 1, 8: 1} // offsets 0-3 and 8 of txnRun's log of 11
	twice := map[int64]int64{0: 1, 1: 1, 2: 1, 3: 1, 8: 2}
	aborted := map[int64]int64{0: 1, 1: 1, 2: 1, 3: 1, 5: 1, 8: 1}
	for _, tc := range []struct {
		name    string
		states  []FileState
		checked int
		want    map[string]int64
	}{
		{"the last owner's file exact", []FileState{{Instance: "c1", Watermark: 11, Counts: right}}, 1, nil},
		{"an earlier owner's file behind", []FileState{{Instance: "c1", Watermark: 11, Counts: right}, {Instance: "c2", Watermark: 4, Counts: twice}}, 1, nil},
		{"a message applied twice", []FileState{{Instance: "c1", Watermark: 11, Counts: twice}}, 1, map[string]int64{VState: 1}},
		{"an aborted record applied", []FileState{{Instance: "c1", Watermark: 11, Counts: aborted}}, 1, map[string]int64{VState: 1}},
		{"no file at the log end", []FileState{{Instance: "c1", Watermark: 9, Counts: right}}, 0, map[string]int64{VState: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := txnRun(0, 1, 2, 3, 8)
			s.in.States = tc.states
			r := s.check(t)
			wantViolations(t, r, tc.want)
			if r.StatesChecked != tc.checked {
				t.Errorf("StatesChecked %d, want %d", r.StatesChecked, tc.checked)
			}
		})
	}
}

// A process whose membership lapsed (an L line) during a fault and that
// the group gave the partition back to handles again what it had handled
// since Kafka's commit, as a new owner would: a fault's duplicates, within
// the hand-off's bound. Without the loss, or without a fault to explain
// it, the same repeat is a broken promise.
func TestCheckSameProcessAfterLapse(t *testing.T) {
	for _, tc := range []struct {
		name      string
		lost      bool
		fault     bool
		committed int64
		want      map[string]int64
	}{
		{"lapse during a broker restart", true, true, 8, map[string]int64{}},
		{"beyond the bound", true, true, 9, map[string]int64{VFaultBound: 1, VBelowCommitted: 1}},
		{"no loss recorded", false, true, 8, map[string]int64{VSameProcess: 2, VBackwards: 1}},
		{"no fault", true, false, 8, map[string]int64{VSameProcess: 2, VBackwards: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSynth(1, 20)
			s.proc(a1, 0, 200*time.Second, EndSIGTERM)
			if tc.fault {
				s.fault(BrokerRestart, "", 96*time.Second, 102*time.Second)
			}
			s.handle(a1, 7, 0, 0, 10, 100*time.Second)
			s.commit(0, 100*time.Second+500*time.Millisecond, tc.committed)
			if tc.lost {
				l := s.ledgers[a1]
				l.Lost = append(l.Lost, at(101*time.Second))
			}
			s.handle(a1, 9, 0, 8, 20, 103*time.Second)
			s.commit(0, 104*time.Second, 20)
			r := s.check(t)
			wantViolations(t, r, tc.want)
			if tc.lost && tc.fault && r.Duplicates[Cause(BrokerRestart)] != 2 {
				t.Fatalf("duplicates %v, want 2 attributed to the broker restart", r.Duplicates)
			}
		})
	}
}
