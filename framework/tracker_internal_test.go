package framework

import (
	"math/rand/v2"
	"testing"
)

func TestTrackerInOrder(t *testing.T) {
	tr := newTracker(10)
	if got := tr.watermark(); got != 10 {
		t.Fatalf("initial watermark = %d", got)
	}
	for o := int64(10); o < 20; o++ {
		tr.dispatch(o)
		if got := tr.watermark(); got != o {
			t.Fatalf("after dispatch(%d) watermark = %d", o, got)
		}
		tr.complete(o)
		if got := tr.watermark(); got != o+1 {
			t.Fatalf("after complete(%d) watermark = %d", o, got)
		}
	}
}

func TestTrackerOutOfOrder(t *testing.T) {
	tr := newTracker(0)
	for _, o := range []int64{0, 1, 2, 5, 6, 9} { // 3, 4, 7, 8 do not exist
		tr.dispatch(o)
	}
	steps := []struct {
		complete int64
		want     int64
	}{
		{6, 0}, {2, 0}, {0, 1}, {9, 1}, {1, 5}, {5, 10},
	}
	for _, s := range steps {
		if !tr.complete(s.complete) {
			t.Fatalf("complete(%d) = false", s.complete)
		}
		if got := tr.watermark(); got != s.want {
			t.Fatalf("after complete(%d) watermark = %d, want %d", s.complete, got, s.want)
		}
	}
	if tr.complete(5) || tr.complete(3) || tr.complete(100) {
		t.Fatal("complete of a done, missing or unknown offset reported true")
	}
	if tr.inFlight() != 0 {
		t.Fatalf("inFlight = %d", tr.inFlight())
	}
}

func TestTrackerGapsNeverStall(t *testing.T) {
	tr := newTracker(100)
	tr.advance(105) // 100..104 were transaction markers
	if got := tr.watermark(); got != 105 {
		t.Fatalf("watermark after advance = %d", got)
	}
	if tr.dispatch(103) {
		t.Fatal("dispatch below watermark accepted")
	}
	tr.dispatch(107)
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

// TestTrackerRandomCompletions checks against a simple model that the
// watermark is always the lowest dispatched offset not done, for random
// gaps and random completion orders.
func TestTrackerRandomCompletions(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		start := int64(r.IntN(1000))
		tr := newTracker(start)
		var offsets []int64
		o := start
		for i := 0; i < 1+r.IntN(200); i++ {
			o += 1 + int64(r.IntN(3))
			offsets = append(offsets, o)
		}
		for _, x := range offsets {
			tr.dispatch(x)
		}
		end := offsets[len(offsets)-1] + 1 + int64(r.IntN(3))
		tr.advance(end)
		done := map[int64]bool{}
		last := tr.watermark()
		for _, i := range r.Perm(len(offsets)) {
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
		}
		if last != end {
			t.Fatalf("round %d: final watermark %d, want %d", round, last, end)
		}
	}
}

func TestTrackerReset(t *testing.T) {
	tr := newTracker(5)
	tr.dispatch(5)
	tr.complete(5)
	tr.reset(2)
	if got := tr.watermark(); got != 2 {
		t.Fatalf("watermark after reset = %d", got)
	}
}
