package offsetfile

import (
	"cmp"
	"context"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// Marker records the watermark of one key at the cost of an atomic store, for
// a consumer that marks every message it handles. The latest value set is
// folded into the key's queued update when the writer next flushes, when
// another update of the key is queued (so that updates keep their order),
// and when Get or Flush is called: Marker.Set followed by SetWatermark,
// RecordReset or Flush behaves as SetWatermark would.
//
// A Marker made by NewMarker takes its value from Set, and records no
// completed ranges (Record.Completed is cleared when it is folded); one made
// by NewProgressMarker takes its value from its Progress, read when it is
// folded, and records the completed ranges with the watermark.
//
// A Marker is used by one goroutine at a time, except Changed, which any
// goroutine may call; neither Set nor Changed blocks on the disk. Close it
// when done; a Store holds at most one Marker per key, the newest.
type Marker struct {
	s          *Store
	k          Key
	generation int32
	member     string
	progress   Progress // nil for a Marker of NewMarker

	wm      atomic.Int64
	durable atomic.Int64 // the key's watermark as last made durable; -1 none
	// durableDone is what the key's durable record proves done: its
	// watermark plus the offsets of its completed ranges (-1 none).
	durableDone atomic.Int64
	dirty       atomic.Bool // a value is set and not folded yet
	closed      atomic.Bool
	invalid     bool  // progress returned invalid ranges once (logged); s.mu guards it
	sl          *slot // the key's slot
}

// Progress reports a key's watermark and the offsets completed above it (see
// Record.Completed). It is called by the Store with its lock held, when the
// Marker's value is folded: it must be quick and must not call the Store.
// The returned slice is owned by the Store afterwards.
//
// A negative watermark means nothing to record yet: the fold is skipped.
// Ranges that break Record.Completed's rules are a bug: the Store logs it at
// error level, once per Marker, and records what they claim above the
// watermark, sorted and merged; beyond the limit on their number, the
// lowest ranges are kept.
type Progress func() (watermark int64, completed []Range)

// NewMarker returns a Marker that records k's watermark as owned by the given
// generation and member.
func (s *Store) NewMarker(k Key, generation int32, member string) (*Marker, error) {
	return s.newMarker("new marker", k, generation, member, nil)
}

// NewProgressMarker returns a Marker whose value is read from p when it is
// folded: its watermark and completed ranges, recorded as owned by the
// given generation and member. Call Changed after p's value changed; Set is
// not used on it (it ignores Set). p must not be nil.
func (s *Store) NewProgressMarker(k Key, generation int32, member string, p Progress) (*Marker, error) {
	const op = "new progress marker"
	if p == nil {
		return nil, s.fileErr(op, errNilProgress)
	}
	return s.newMarker(op, k, generation, member, p)
}

func (s *Store) newMarker(op string, k Key, generation int32, member string, p Progress) (*Marker, error) {
	if err := validateKey(k); err != nil {
		return nil, s.fileErr(op, err)
	}
	if err := validateString("member id", member); err != nil {
		return nil, s.fileErr(op, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.readOnly:
		return nil, s.fileErr(op, ErrReadOnly)
	case s.closed:
		return nil, s.fileErr(op, ErrClosed)
	}
	m := &Marker{s: s, k: k, generation: generation, member: member, progress: p}
	m.durable.Store(-1)
	m.durableDone.Store(-1)
	sl := s.slotLocked(k)
	m.sl = sl
	if sl.hasDurable {
		m.setDurable(&sl.durable)
	}
	if old := sl.marker; old != nil {
		s.foldLocked(old, now())
	}
	sl.marker = m
	return m, nil
}

// Set records watermark (the next offset to process; negative values are
// ignored, and so is every call after Close, and every call on a Marker of
// NewProgressMarker). It does not wait for the disk.
func (m *Marker) Set(watermark int64) {
	if watermark < 0 || m.progress != nil || m.closed.Load() {
		return
	}
	m.wm.Store(watermark)
	m.changed()
}

// Changed records that the Marker's Progress has a new value; like Set it
// does not wait for the disk and costs an atomic swap when the Marker is
// already waiting to be folded. Any goroutine may call it, concurrently. It
// is ignored after Close, and on a Marker of NewMarker.
//
// A fold reads the Progress after it has taken the Marker's changed state:
// a change made before Changed returns is in this fold or the next one.
func (m *Marker) Changed() {
	if m.progress == nil || m.closed.Load() {
		return
	}
	m.changed()
}

func (m *Marker) changed() {
	if m.dirty.Swap(true) {
		return // already waiting to be folded: the writer reads the latest value
	}
	s := m.s
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.dirtyMarkers = append(s.dirtyMarkers, m)
	s.queuedLocked()
}

// Durable returns the key's watermark as the last successful flush made it
// durable (-1 if none): one atomic load, for a caller that bounds how far
// its handling may run ahead of the file.
func (m *Marker) Durable() int64 { return m.durable.Load() }

// DurableDone returns how many offsets the key's durable record proves
// done: its watermark plus the offsets in its completed ranges (-1 if
// none). A Marker of NewProgressMarker bounds by it the work a crash would
// repeat, when offsets complete out of order above the watermark.
func (m *Marker) DurableDone() int64 { return m.durableDone.Load() }

// Flushed returns a channel closed when the Store's current flush attempt
// ends, for a caller that waits for DurableDone while it does other work:
// read DurableDone after taking the channel.
func (m *Marker) Flushed() <-chan struct{} {
	m.s.mu.Lock()
	defer m.s.mu.Unlock()
	return m.s.flushed
}

// setDurable records rec as the key's durable record; s.mu is held, or the
// Marker is not shared yet.
func (m *Marker) setDurable(rec *Record) {
	m.durable.Store(rec.Watermark)
	done := rec.Watermark
	for _, r := range rec.Completed {
		done += r.To - r.From
	}
	m.durableDone.Store(done)
}

// WaitDurable waits until the key's durable watermark is at least
// watermark, through flushes that fail (a full disk, an I/O error: the
// writer retries them) until one succeeds. It returns ctx's error if ctx
// ends first, and an error wrapping ErrClosed if the Store is closed.
func (m *Marker) WaitDurable(ctx context.Context, watermark int64) error {
	s := m.s
	for m.durable.Load() < watermark {
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			return s.fileErr("wait durable", ErrClosed)
		}
		flushed := s.flushed
		s.mu.Unlock()
		if m.durable.Load() >= watermark {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-flushed:
		}
	}
	return nil
}

// Close folds the last value set and detaches the Marker from its key.
func (m *Marker) Close() {
	m.closed.Store(true)
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.foldLocked(m, now())
	if m.sl.marker == m {
		m.sl.marker = nil
	}
}

// foldLocked merges m's unfolded value into the pending updates, recorded
// at t (a flush folds every dirty Marker with one clock read); s.mu is
// held.
func (s *Store) foldLocked(m *Marker, t time.Time) {
	if !m.dirty.Swap(false) {
		return
	}
	rec := Record{Generation: m.generation, Member: m.member}
	if m.progress == nil {
		rec.Watermark = m.wm.Load()
	} else {
		// After the Swap: a Changed that found the Marker dirty is seen here.
		rec.Watermark, rec.Completed = m.progress()
		if rec.Watermark < 0 {
			return
		}
		rec.Completed = s.checkProgressLocked(m, rec.Watermark, rec.Completed)
	}
	rec.RecordedAt = t
	s.queueLocked(m.sl, patch{fields: setWatermark | setOwner, rec: rec})
}

// checkProgressLocked returns the completed ranges a Progress returned, as
// they may be recorded: nil instead of empty, the lowest maxRanges if more.
// Ranges that break Record.Completed's rules are a bug of the Progress,
// logged at error level once per Marker; what they claim above the
// watermark is kept, sorted and merged, so that the bug costs no completed
// offset: only the watermark's own offset, which is never done, is dropped.
func (s *Store) checkProgressLocked(m *Marker, watermark int64, completed []Range) []Range {
	if len(completed) == 0 {
		return nil
	}
	if err := validateCompleted(watermark, completed[:min(len(completed), maxRanges)]); err != nil {
		if !m.invalid {
			m.invalid = true
			s.log.Error(msgInvalidProgress,
				zap.String("group", m.k.Group), zap.String("topic", m.k.Topic), zap.Int("partition", int(m.k.Partition)),
				zap.Int64("offset", watermark), zap.Error(err))
		}
		completed = normalizeRanges(watermark, completed)
		if len(completed) == 0 {
			return nil
		}
	}
	return completed[:min(len(completed), maxRanges):min(len(completed), maxRanges)]
}

// msgInvalidProgress is logged when a Progress breaks Record.Completed's
// rules: a bug, which tests fail on.
const msgInvalidProgress = "progress marker returned invalid completed ranges; recording the offsets they claim above the watermark, sorted and merged"

// normalizeRanges returns the offsets rs covers above watermark as sorted,
// disjoint, not touching ranges, in a new slice.
func normalizeRanges(watermark int64, rs []Range) []Range {
	out := make([]Range, 0, len(rs))
	for _, r := range rs {
		r.From = max(r.From, watermark+1)
		if r.From < r.To {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Range) int { return cmp.Compare(a.From, b.From) })
	n := 0
	for _, r := range out {
		if n > 0 && r.From <= out[n-1].To {
			out[n-1].To = max(out[n-1].To, r.To)
			continue
		}
		out[n] = r
		n++
	}
	return out[:n]
}

// foldKeyLocked folds the unfolded value of k's Marker, if any.
func (s *Store) foldKeyLocked(k Key) {
	if sl := s.slots[k]; sl != nil && sl.marker != nil {
		s.foldLocked(sl.marker, now())
	}
}
