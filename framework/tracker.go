package framework

import (
	"sort"
	"sync"
	"sync/atomic"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// tracker turns completions of offsets, which arrive out of order when a
// partition's messages are handled concurrently (dispatch.go), into a
// contiguous watermark: the lowest offset not yet done. Offsets never
// dispatched (gaps left by compaction, transaction markers, offsets an
// earlier run completed) never hold it back: the watermark jumps over them.
//
// Its progress, the watermark and the offsets completed above it, is what
// the offset file records (offsetfile.Progress): every offset in
// [watermark, hi) that is not dispatched-and-not-done is done, and so are the
// ranges an earlier run completed above hi.
//
// The partition's goroutine owns a tracker and makes every change; mu lets
// the offset file's writer read the progress when it flushes. The watermark
// is published to processed, under mu, before the writer can see it.
//
// A partition that handles one message at a time in offset order (the
// dispatcher's direct mode) uses beginOne and completeOne instead of begin
// and complete: its call in flight is kept in atomics, not in pend, and a
// message costs no lock (BenchmarkTracker: 25 ns a message against 43).
// Its watermark is then hi: the offset in a call is at or above it.
type tracker struct {
	mu sync.Mutex
	// pend[head:] are the dispatched offsets at or above the watermark, in
	// increasing order. pend[head] is never done: the head moves past done
	// entries at once.
	pend []pending
	head int
	// done counts the done entries in pend[head:].
	done int
	// hi is the offset after the highest one dispatched or known done or
	// absent: with nothing pending, the watermark is hi. Only the owner
	// writes it; the writer reads it under mu, or without in direct mode.
	hi atomic.Int64
	// restored are ranges an earlier run completed, strictly above hi: a
	// range that hi reaches is absorbed into it (absorbLocked), so that
	// progress never reports an offset twice.
	restored []offsetfile.Range
	// restoredLen is the number of offsets in restored.
	restoredLen int64
	// lastTS is the record timestamp of the last offset dispatched.
	lastTS atomic.Int64
	// cur is the offset of the last call in direct mode (beginOne), -1
	// before the first, and curAt its dispatch time: it is in the call
	// while it is at or above hi (completeOne moves hi past it).
	cur, curAt atomic.Int64

	processed *atomic.Int64
}

// pending is one dispatched offset: when (UnixNano, to the batch), its
// record timestamp (UnixNano) and whether it is done.
type pending struct {
	offset int64
	at     int64
	ts     int64
	done   bool
}

// newTracker starts at offset start with the ranges an earlier run
// completed above it (from the offset file); it publishes its watermark to
// processed.
func newTracker(start int64, restored []offsetfile.Range, processed *atomic.Int64) *tracker {
	t := &tracker{processed: processed}
	t.hi.Store(start)
	t.cur.Store(-1)
	for _, r := range restored {
		if r.To > start+1 {
			r.From = max(r.From, start+1)
			t.restored = append(t.restored, r)
			t.restoredLen += r.To - r.From
		}
	}
	return t
}

// absorbLocked moves hi past the restored ranges it reaches: every offset
// in them is done, so none is dispatched and none reported twice.
func (t *tracker) absorbLocked() {
	for len(t.restored) > 0 && t.restored[0].From <= t.hi.Load() {
		t.hi.Store(max(t.hi.Load(), t.restored[0].To))
		t.dropRestoredLocked()
	}
}

func (t *tracker) dropRestoredLocked() {
	t.restoredLen -= t.restored[0].To - t.restored[0].From
	t.restored = t.restored[1:]
}

// reach is how many offsets the partition has dispatched, done or passed:
// hi, plus the offsets of the ranges restored above it. reach less the
// offset file's DurableDone is what the file does not prove done yet: the
// messages in a call or waiting for one, and those done since the last
// flush. Only the owner calls it.
func (t *tracker) reach() int64 { return t.hi.Load() + t.restoredLen }

// skip reports whether offset needs no Handler call: it is below hi (a
// message fetched again) or an earlier run completed it. Such an offset is
// passed over: the watermark moves beyond it once everything before it is
// done.
func (t *tracker) skip(offset int64) bool {
	if offset < t.hi.Load() {
		return true
	}
	if len(t.restored) == 0 {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for len(t.restored) > 0 && t.restored[0].To <= offset {
		t.dropRestoredLocked()
	}
	if len(t.restored) == 0 || offset < t.restored[0].From {
		return false
	}
	// The offsets between hi and this one do not exist (they were not
	// fetched): hi moves to the end of the range.
	t.hi.Store(offset)
	t.absorbLocked()
	t.publishLocked()
	return true
}

// begin records that offset was handed to a call; at is the time and ts
// the record's timestamp, in UnixNano. Offsets begin in increasing
// order, above hi (see skip).
func (t *tracker) begin(offset, at, ts int64) {
	t.mu.Lock()
	if t.head > 0 && t.head >= len(t.pend)/2 {
		// Compact: the backing array stays bounded by the window.
		n := copy(t.pend, t.pend[t.head:])
		t.pend, t.head = t.pend[:n], 0
	}
	t.pend = append(t.pend, pending{offset: offset, at: at, ts: ts})
	t.hi.Store(offset + 1)
	t.lastTS.Store(ts)
	t.absorbLocked()
	t.mu.Unlock()
}

// beginOne is begin in direct mode: offset, above hi, is handed to the
// only call, and nothing else is pending.
func (t *tracker) beginOne(offset, at, ts int64) {
	t.curAt.Store(at)
	t.lastTS.Store(ts)
	t.cur.Store(offset)
}

// completeOne is complete in direct mode: the call on offset (beginOne)
// returned, and everything below offset+1 is done or absent. Only a
// restored range it reaches takes the lock.
func (t *tracker) completeOne(offset int64) {
	if len(t.restored) > 0 {
		t.mu.Lock()
		t.hi.Store(offset + 1)
		t.absorbLocked()
		t.publishLocked()
		t.mu.Unlock()
		return
	}
	// processed before hi: the writer reads hi as the watermark it
	// makes durable, and Stats must never show durable above processed.
	t.processed.Store(offset + 1)
	t.hi.Store(offset + 1)
}

// calling reports whether a direct-mode call is in flight (beginOne
// without its completeOne); Stats count it in InFlight.
func (t *tracker) calling() bool {
	c := t.cur.Load()
	return c >= 0 && c >= t.hi.Load()
}

// complete marks dispatched offsets done. Completing an offset twice, or
// one never dispatched, is a no-op.
func (t *tracker) complete(offsets ...int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	live := t.pend[t.head:]
	for _, o := range offsets {
		i := len(live)
		if len(live) > 0 {
			// Offsets without gaps sit at their distance from the head.
			if k := o - live[0].offset; k >= 0 && k < int64(len(live)) && live[k].offset == o {
				i = int(k)
			} else {
				i = sort.Search(len(live), func(i int) bool { return live[i].offset >= o })
			}
		}
		if i == len(live) || live[i].offset != o || live[i].done {
			continue
		}
		live[i].done = true
		t.done++
	}
	n := 0
	for n < len(live) && live[n].done {
		n++
	}
	if n > 0 {
		t.head += n
		t.done -= n
		t.publishLocked()
	}
}

// advance records that no offset below upTo remains to be dispatched:
// offsets between the last dispatched one and upTo do not exist.
func (t *tracker) advance(upTo int64) {
	if upTo <= t.hi.Load() {
		return
	}
	t.mu.Lock()
	t.hi.Store(upTo)
	t.absorbLocked()
	t.publishLocked()
	t.mu.Unlock()
}

func (t *tracker) watermarkLocked() int64 {
	if t.head < len(t.pend) {
		return t.pend[t.head].offset
	}
	return t.hi.Load()
}

func (t *tracker) publishLocked() { t.processed.Store(t.watermarkLocked()) }

// watermark is the next offset to process: every offset below it is done
// or does not exist.
func (t *tracker) watermark() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.watermarkLocked()
}

// window is the number of dispatched offsets at or above the watermark:
// in a call, waiting, or done above an older one.
func (t *tracker) window() int { return len(t.pend) - t.head }

// state returns the offsets done above the watermark, and the oldest
// dispatched offset not done with its dispatch time (-1, 0 if none). ts is
// that offset's record timestamp, or, with none, the last dispatched one's
// (0 before the first).
func (t *tracker) state() (doneAbove int, oldest, at, ts int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.head == len(t.pend) {
		if t.calling() {
			// In direct mode: a reader racing beginOne may pair the
			// offset with the next call's times, which are only younger.
			return 0, t.cur.Load(), t.curAt.Load(), t.lastTS.Load()
		}
		return t.done, -1, 0, t.lastTS.Load()
	}
	h := &t.pend[t.head]
	return t.done, h.offset, h.at, h.ts
}

// progress is the tracker's offsetfile.Progress: the watermark and the
// ranges done above it.
func (t *tracker) progress() (int64, []offsetfile.Range) {
	t.mu.Lock()
	defer t.mu.Unlock()
	wm := t.watermarkLocked()
	var out []offsetfile.Range
	add := func(from, to int64) {
		if from >= to {
			return
		}
		if n := len(out); n > 0 && out[n-1].To == from {
			out[n-1].To = to
			return
		}
		out = append(out, offsetfile.Range{From: from, To: to})
	}
	// Everything in (wm, hi) but the entries not done is done or absent;
	// the restored ranges lie above hi.
	prev := wm
	for _, p := range t.pend[t.head:] {
		if !p.done {
			add(prev+1, p.offset)
			prev = p.offset
		}
	}
	if t.head < len(t.pend) {
		add(prev+1, t.hi.Load())
	}
	for _, r := range t.restored {
		add(r.From, r.To)
	}
	return wm, out
}

// reset forgets everything and starts again at offset, for a partition whose
// position was moved by policy (offset out of range). Only valid with nothing
// in a call.
func (t *tracker) reset(offset int64) {
	t.mu.Lock()
	t.pend, t.head, t.done = t.pend[:0], 0, 0
	t.hi.Store(offset)
	t.cur.Store(-1) // it may lie above the new hi
	t.restored, t.restoredLen = nil, 0
	t.publishLocked()
	t.mu.Unlock()
}
