package offsetstore

import "sync/atomic"

// Marker records the watermark of one key at the cost of an atomic store, for
// a consumer that marks every message it handles. The latest value set is
// folded into the key's queued update when the writer next flushes, when
// another update of the key is queued (so that updates keep their order),
// and when Get or Flush is called: Marker.Set followed by SetWatermark,
// RecordReset or Flush behaves as SetWatermark would.
//
// A Marker is used by one goroutine at a time; Set never blocks on the disk.
// Close it when done; a Store holds at most one Marker per key, the newest.
type Marker struct {
	s          *Store
	k          Key
	generation int32
	member     string

	wm     atomic.Int64
	dirty  atomic.Bool // a value is set and not folded yet
	closed atomic.Bool
}

// NewMarker returns a Marker that records k's watermark as owned by the given
// generation and member.
func (s *Store) NewMarker(k Key, generation int32, member string) (*Marker, error) {
	const op = "new marker"
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
	m := &Marker{s: s, k: k, generation: generation, member: member}
	if s.markers == nil {
		s.markers = map[Key]*Marker{}
	}
	if old := s.markers[k]; old != nil {
		s.foldLocked(old)
	}
	s.markers[k] = m
	return m, nil
}

// Set records watermark (the next offset to process; negative values are
// ignored, and so is every call after Close). It does not wait for the disk.
func (m *Marker) Set(watermark int64) {
	if watermark < 0 || m.closed.Load() {
		return
	}
	m.wm.Store(watermark)
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

// Close folds the last value set and detaches the Marker from its key.
func (m *Marker) Close() {
	m.closed.Store(true)
	s := m.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.foldLocked(m)
	if s.markers[m.k] == m {
		delete(s.markers, m.k)
	}
}

// foldLocked merges m's unfolded value into the pending updates; s.mu is
// held.
func (s *Store) foldLocked(m *Marker) {
	if !m.dirty.Swap(false) {
		return
	}
	p := patch{
		fields: setWatermark | setOwner,
		rec:    Record{Watermark: m.wm.Load(), RecordedAt: now(), Generation: m.generation, Member: m.member},
	}
	if old, ok := s.pending[m.k]; ok {
		p = old.merge(p)
	}
	s.pending[m.k] = p
}

// foldKeyLocked folds the unfolded value of k's Marker, if any.
func (s *Store) foldKeyLocked(k Key) {
	if m := s.markers[k]; m != nil {
		s.foldLocked(m)
	}
}
