package framework

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"pgregory.net/rapid"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

func newTestTracker(start int64, restored ...offsetfile.Range) (*tracker, *atomic.Int64) {
	var processed atomic.Int64
	return newTracker(start, restored, &processed), &processed
}

func TestTrackerInOrder(t *testing.T) {
	tr, processed := newTestTracker(10)
	if got := tr.watermark(); got != 10 {
		t.Fatalf("initial watermark = %d", got)
	}
	for o := int64(10); o < 20; o++ {
		tr.begin(o, 1, 0)
		if got := tr.watermark(); got != o {
			t.Fatalf("after dispatch(%d) watermark = %d", o, got)
		}
		tr.complete(o)
		if got := tr.watermark(); got != o+1 || processed.Load() != o+1 {
			t.Fatalf("after complete(%d) watermark = %d, published %d", o, got, processed.Load())
		}
		if wm, rs := tr.progress(); wm != o+1 || rs != nil {
			t.Fatalf("progress = %d %v", wm, rs)
		}
	}
}

func TestTrackerOutOfOrder(t *testing.T) {
	tr, _ := newTestTracker(0)
	for _, o := range []int64{0, 1, 2, 5, 6, 9} { // 3, 4, 7, 8 do not exist
		tr.begin(o, 1, 0)
	}
	steps := []struct {
		complete int64
		want     int64
		ranges   []offsetfile.Range
	}{
		// Absent offsets between done ones may be in a range: no
		// message has them.
		{6, 0, []offsetfile.Range{{From: 3, To: 5}, {From: 6, To: 9}}},
		{2, 0, []offsetfile.Range{{From: 2, To: 5}, {From: 6, To: 9}}},
		{0, 1, []offsetfile.Range{{From: 2, To: 5}, {From: 6, To: 9}}},
		{9, 1, []offsetfile.Range{{From: 2, To: 5}, {From: 6, To: 10}}},
		{1, 5, []offsetfile.Range{{From: 6, To: 10}}},
		{5, 10, nil},
	}
	for _, s := range steps {
		tr.complete(s.complete)
		if got := tr.watermark(); got != s.want {
			t.Fatalf("after complete(%d) watermark = %d, want %d", s.complete, got, s.want)
		}
		if wm, rs := tr.progress(); wm != s.want || !slices.Equal(rs, s.ranges) {
			t.Fatalf("after complete(%d) progress = %d %v, want %d %v", s.complete, wm, rs, s.want, s.ranges)
		}
	}
	tr.complete(5, 3, 100) // done, missing, unknown: no-ops
	if done, oldest, _, _ := tr.state(); done != 0 || oldest != -1 || tr.window() != 0 {
		t.Fatalf("state = %d done, oldest %d, window %d", done, oldest, tr.window())
	}
}

func TestTrackerGapsNeverStall(t *testing.T) {
	tr, _ := newTestTracker(100)
	tr.advance(105) // 100..104 were transaction markers
	if got := tr.watermark(); got != 105 {
		t.Fatalf("watermark after advance = %d", got)
	}
	if !tr.skip(103) {
		t.Fatal("an offset below the watermark is not skipped")
	}
	tr.begin(107, 1, 0)
	tr.advance(110) // 108, 109 compacted away; must not pass 107 while it is pending
	if got := tr.watermark(); got != 107 {
		t.Fatalf("watermark with 107 pending = %d", got)
	}
	tr.complete(107)
	if got := tr.watermark(); got != 110 {
		t.Fatalf("watermark = %d, want 110", got)
	}
	tr.advance(90) // never goes back
	if got := tr.watermark(); got != 110 {
		t.Fatalf("watermark after advance backwards = %d", got)
	}
}

// TestTrackerRestored: ranges an earlier run completed are skipped, kept in
// the progress until the watermark passes them, and never hold the
// watermark back.
func TestTrackerRestored(t *testing.T) {
	tr, _ := newTestTracker(10, offsetfile.Range{From: 3, To: 8}, offsetfile.Range{From: 12, To: 15}, offsetfile.Range{From: 20, To: 21})
	if wm, rs := tr.progress(); wm != 10 || !slices.Equal(rs, []offsetfile.Range{{From: 12, To: 15}, {From: 20, To: 21}}) {
		t.Fatalf("progress at start = %d %v", wm, rs)
	}
	for o := int64(10); o < 22; o++ {
		want := o >= 12 && o < 15 || o == 20
		if got := tr.skip(o); got != want {
			t.Fatalf("skip(%d) = %v, want %v", o, got, want)
		}
		if !want {
			tr.begin(o, 1, 0)
		}
	}
	tr.complete(11, 15, 16, 17, 18, 19, 21)
	if wm, rs := tr.progress(); wm != 10 || !slices.Equal(rs, []offsetfile.Range{{From: 11, To: 22}}) {
		t.Fatalf("progress with 10 pending = %d %v", wm, rs)
	}
	tr.complete(10)
	if wm, rs := tr.progress(); wm != 22 || rs != nil {
		t.Fatalf("final progress = %d %v", wm, rs)
	}
}

// TestTrackerRandomCompletions checks against a simple model that the
// watermark is always the lowest dispatched offset not done, and that the
// progress, restored by a new tracker, skips exactly the done offsets, for
// random gaps and random completion orders.
func TestTrackerRandomCompletions(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		start := int64(r.IntN(1000))
		tr, _ := newTestTracker(start)
		var offsets []int64
		o := start
		for i := 0; i < 1+r.IntN(200); i++ {
			o += 1 + int64(r.IntN(3))
			offsets = append(offsets, o)
		}
		for _, x := range offsets {
			tr.begin(x, 1, 0)
		}
		end := offsets[len(offsets)-1] + 1 + int64(r.IntN(3))
		tr.advance(end)
		done := map[int64]bool{}
		last := tr.watermark()
		perm := r.Perm(len(offsets))
		for step, i := range perm {
			tr.complete(offsets[i])
			done[offsets[i]] = true
			want := end
			for _, x := range offsets {
				if !done[x] {
					want = x
					break
				}
			}
			got := tr.watermark()
			if got != want {
				t.Fatalf("round %d: watermark = %d, want %d", round, got, want)
			}
			if got < last {
				t.Fatalf("round %d: watermark went back from %d to %d", round, last, got)
			}
			last = got
			if step%17 != 0 {
				continue
			}
			// A restart from this progress skips exactly what is done.
			wm, rs := tr.progress()
			again, _ := newTestTracker(wm, rs...)
			for _, x := range offsets {
				if x < wm {
					continue
				}
				if skip := again.skip(x); skip != done[x] {
					t.Fatalf("round %d: restored skip(%d) = %v, done %v (progress %d %v)", round, x, skip, done[x], wm, rs)
				}
				if !done[x] {
					again.begin(x, 1, 0)
				}
			}
		}
		if last != end {
			t.Fatalf("round %d: final watermark %d, want %d", round, last, end)
		}
	}
}

func TestTrackerReset(t *testing.T) {
	tr, processed := newTestTracker(5, offsetfile.Range{From: 7, To: 9})
	tr.begin(5, 1, 0)
	tr.complete(5)
	tr.reset(2)
	if wm, rs := tr.progress(); wm != 2 || rs != nil || processed.Load() != 2 {
		t.Fatalf("progress after reset = %d %v (published %d)", wm, rs, processed.Load())
	}
}

// TestTrackerWindowCompacts: a long-running window's array stays bounded by
// what is pending, not by what passed through it.
func TestTrackerWindowCompacts(t *testing.T) {
	tr, _ := newTestTracker(0)
	for o := int64(0); o < 100000; o++ {
		tr.begin(o, 1, 0)
		if o >= 10 {
			tr.complete(o - 10)
		}
	}
	if tr.window() != 10 || cap(tr.pend) > 64 {
		t.Fatalf("window %d, array capacity %d", tr.window(), cap(tr.pend))
	}
}

// Issue 26 item 5: one key's call held through two graceful restarts, with
// 3,000 offsets completed above it in the first run. Each restart must
// carry the completed range on: before, the second run's progress listed
// it twice, the offset file dropped both, and the third run handled all
// 3,000 again.
func TestProgressModelRegressions(t *testing.T) {
	t.Run("held call through two restarts", func(t *testing.T) {
		var proc atomic.Int64
		restored := []offsetfile.Range{{From: 1, To: 3001}}
		for run := 2; run <= 3; run++ {
			tr := newTracker(0, restored, &proc)
			tr.begin(0, 0, 0) // the held call, again
			for o := int64(1); o < 3001; o++ {
				if !tr.skip(o) {
					t.Fatalf("run %d: offset %d handed out again", run, o)
				}
			}
			wm, got := tr.progress()
			if wm != 0 || len(got) != 1 || got[0] != (offsetfile.Range{From: 1, To: 3001}) {
				t.Fatalf("run %d: progress (%d, %v), want (0, [{1 3001}])", run, wm, got)
			}
			restored = got
		}
	})
	t.Run("found by TestProgressModel: a fetch past a restored range", func(t *testing.T) {
		var proc atomic.Int64
		tr := newTracker(9, []offsetfile.Range{{From: 15, To: 16}}, &proc)
		for o := int64(9); o < 15; o++ {
			tr.begin(o, 0, 0)
		}
		if !tr.skip(15) {
			t.Fatal("offset 15, restored, handed out")
		}
		tr.advance(16)
		wm, got := tr.progress()
		if wm != 9 || len(got) != 1 || got[0] != (offsetfile.Range{From: 15, To: 16}) {
			t.Fatalf("progress (%d, %v), want (9, [{15 16}]) once", wm, got)
		}
	})
}

// BenchmarkTracker: the tracker's per-message work on the data path,
// one call at a time (the direct mode: OrderPartition with a Handler), in
// order and completing 64 behind (OrderKey), for A/B runs of changes to it.
func BenchmarkTracker(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		var processed atomic.Int64
		tr := newTracker(0, nil, &processed)
		for i := int64(0); i < int64(b.N); i++ {
			if tr.skip(i) {
				b.Fatal("skipped")
			}
			tr.beginOne(i, 0, 0)
			tr.completeOne(i)
		}
	})
	for _, lag := range []int64{0, 64} {
		b.Run(fmt.Sprintf("lag=%d", lag), func(b *testing.B) {
			var processed atomic.Int64
			tr := newTracker(0, nil, &processed)
			b.ReportAllocs()
			for i := int64(0); i < int64(b.N); i++ {
				if tr.skip(i) {
					b.Fatal("skipped")
				}
				tr.begin(i, 0, 0)
				if i >= lag {
					tr.complete(i - lag)
				}
			}
		})
	}
}

// TestTrackerOneAtATime holds the direct mode's beginOne and completeOne to
// begin and complete over random histories (gaps, ranges restored from an
// earlier run, advances past control records, resets): between calls the
// two trackers agree on the watermark, the published one, the progress and
// the state; during a call they agree on the state, and the direct one
// claims no offset done that the other does not.
func TestTrackerOneAtATime(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		start := rapid.Int64Range(0, 50).Draw(rt, "start")
		var restored []offsetfile.Range
		o := start
		for range rapid.IntRange(0, 4).Draw(rt, "ranges") {
			o += rapid.Int64Range(1, 5).Draw(rt, "gap")
			to := o + rapid.Int64Range(1, 5).Draw(rt, "len")
			restored = append(restored, offsetfile.Range{From: o, To: to})
			o = to
		}
		a, pa := newTestTracker(start, restored...)
		b, pb := newTestTracker(start, restored...)
		next := start
		same := func(rt *rapid.T, when string) {
			wa, ra := a.progress()
			wb, rb := b.progress()
			if wa != wb || !slices.Equal(ra, rb) {
				rt.Fatalf("%s: progress %d %v, direct %d %v", when, wa, ra, wb, rb)
			}
			if a.watermark() != b.watermark() || pa.Load() != pb.Load() {
				rt.Fatalf("%s: watermark %d (published %d), direct %d (published %d)", when, a.watermark(), pa.Load(), b.watermark(), pb.Load())
			}
			if a.reach() != b.reach() {
				rt.Fatalf("%s: reach %d, direct %d", when, a.reach(), b.reach())
			}
		}
		sameState := func(rt *rapid.T, when string) {
			d1, o1, at1, ts1 := a.state()
			d2, o2, at2, ts2 := b.state()
			if d1 != d2 || o1 != o2 || at1 != at2 || ts1 != ts2 {
				rt.Fatalf("%s: state %d %d %d %d, direct %d %d %d %d", when, d1, o1, at1, ts1, d2, o2, at2, ts2)
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			"message": func(rt *rapid.T) {
				next += rapid.Int64Range(0, 3).Draw(rt, "gap")
				o := next
				next++
				sa, sb := a.skip(o), b.skip(o)
				if sa != sb {
					rt.Fatalf("skip(%d) = %v, direct %v", o, sa, sb)
				}
				if sa {
					same(rt, fmt.Sprintf("skipped %d", o))
					return
				}
				at := rapid.Int64Range(1, 1000).Draw(rt, "at")
				ts := rapid.Int64Range(-1, 1000).Draw(rt, "ts")
				a.begin(o, at, ts)
				b.beginOne(o, at, ts)
				sameState(rt, fmt.Sprintf("in the call on %d", o))
				wa, ra := a.progress()
				wb, rb := b.progress()
				for x := int64(0); x < next+30; x++ {
					if claims(wb, rb, x) && !claims(wa, ra, x) {
						rt.Fatalf("in the call on %d: direct claims %d done (%d %v), the tracker does not (%d %v)", o, x, wb, rb, wa, ra)
					}
				}
				a.complete(o)
				b.completeOne(o)
				same(rt, fmt.Sprintf("after %d", o))
				sameState(rt, fmt.Sprintf("after %d", o))
			},
			"advance": func(rt *rapid.T) {
				upTo := next + rapid.Int64Range(-2, 3).Draw(rt, "past")
				a.advance(upTo)
				b.advance(upTo)
				next = max(next, upTo)
				same(rt, fmt.Sprintf("advance to %d", upTo))
			},
			"reset": func(rt *rapid.T) {
				to := rapid.Int64Range(0, next+5).Draw(rt, "to")
				a.reset(to)
				b.reset(to)
				next = to
				same(rt, fmt.Sprintf("reset to %d", to))
			},
		})
	})
}

// claims reports whether progress (wm, ranges) records offset x done.
func claims(wm int64, ranges []offsetfile.Range, x int64) bool {
	if x < wm {
		return true
	}
	for _, r := range ranges {
		if r.From <= x && x < r.To {
			return true
		}
	}
	return false
}

// TestTrackerOneAtATimeReaders runs the offset file's and the stats'
// readers against a direct-mode owner (under -race, the lock-free path's
// check): the watermark never goes back, never passes the call in flight,
// never runs ahead of processed (Stats' durable <= processed), and the
// oldest incomplete offset is the one in the call or none.
func TestTrackerOneAtATimeReaders(t *testing.T) {
	tr, processed := newTestTracker(0)
	const n = 20000
	done := make(chan struct{})
	go func() {
		defer close(done)
		for o := int64(0); o < n; o += 1 + o%3 {
			tr.beginOne(o, o+1, o)
			tr.completeOne(o)
		}
		tr.advance(n + 5)
	}()
	last := int64(0)
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		wm, rs := tr.progress()
		if wm < last || rs != nil {
			t.Fatalf("progress %d %v after a watermark of %d", wm, rs, last)
		}
		last = wm
		if _, oldest, at, _ := tr.state(); oldest >= 0 && (oldest < wm || at <= 0) {
			t.Fatalf("oldest incomplete %d (at %d) below the watermark %d", oldest, at, wm)
		}
		if p := processed.Load(); p < wm {
			t.Fatalf("published %d after the writer read a watermark of %d", p, wm)
		}
	}
	if wm, _ := tr.progress(); wm != n+5 || processed.Load() != n+5 {
		t.Fatalf("final watermark %d, published %d; want %d", wm, processed.Load(), n+5)
	}
}
