package framework

import "sort"

// tracker turns completions of offsets, which may arrive out of order, into
// a contiguous watermark: the lowest offset not yet done. Offsets that were
// never dispatched (gaps left by compaction, transaction markers, records
// skipped by the fetcher) never hold it back: the watermark jumps over them.
//
// The partition loop handles messages in order today, so completions arrive
// in order; the tracker does not rely on it, so that handling several
// messages of a partition concurrently can be built on it.
//
// A tracker is not safe for concurrent use; its owner serialises calls.
type tracker struct {
	// pending holds dispatched offsets in increasing order, from the oldest
	// one not yet done; done[i] says whether pending[i] has completed.
	pending []int64
	done    []bool
	// hi is the offset after the highest offset known to be dispatched or
	// known not to exist: with nothing pending, the watermark is hi.
	hi int64
}

func newTracker(start int64) *tracker { return &tracker{hi: start} }

// dispatch records that offset was handed to the handler. Offsets must be
// dispatched in increasing order and at or above the watermark; an offset
// below it is ignored and reported false.
func (t *tracker) dispatch(offset int64) bool {
	if offset < t.hi {
		return false
	}
	t.pending = append(t.pending, offset)
	t.done = append(t.done, false)
	t.hi = offset + 1
	return true
}

// complete marks a dispatched offset done and reports whether it was
// pending. Completing an offset twice, or one never dispatched, is a no-op.
func (t *tracker) complete(offset int64) bool {
	i := sort.Search(len(t.pending), func(i int) bool { return t.pending[i] >= offset })
	if i == len(t.pending) || t.pending[i] != offset || t.done[i] {
		return false
	}
	t.done[i] = true
	n := 0
	for n < len(t.done) && t.done[n] {
		n++
	}
	if n > 0 {
		// Shift rather than re-slice so the backing arrays stay bounded by
		// the number of offsets in flight.
		m := copy(t.pending, t.pending[n:])
		copy(t.done, t.done[n:])
		t.pending, t.done = t.pending[:m], t.done[:m]
	}
	return true
}

// advance records that no offset below upTo remains to be dispatched:
// offsets between the last dispatched one and upTo do not exist.
func (t *tracker) advance(upTo int64) {
	if upTo > t.hi {
		t.hi = upTo
	}
}

// watermark is the next offset to process: every offset below it is done
// or does not exist.
func (t *tracker) watermark() int64 {
	if len(t.pending) > 0 {
		return t.pending[0]
	}
	return t.hi
}

// inFlight is the number of dispatched offsets not yet done, including
// those waiting behind an older one.
func (t *tracker) inFlight() int {
	n := 0
	for _, d := range t.done {
		if !d {
			n++
		}
	}
	return n
}

// reset forgets everything and starts again at offset, for a partition whose
// position was moved by policy (offset out of range). Only valid with nothing
// in flight.
func (t *tracker) reset(offset int64) {
	t.pending, t.done = t.pending[:0], t.done[:0]
	t.hi = offset
}
