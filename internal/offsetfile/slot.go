package offsetfile

import (
	"maps"
	"slices"
)

// slot is one key's records in memory, guarded by Store.mu: what the file
// or its journal holds (durable), what the running flush writes
// (inflight), what the last checkpoint held while the key is journaled
// only (synced), and the key's live Marker. A flush reaches every key it
// writes through one lookup, and its write carries the slot from then on.
//
// inflight and synced are pointers, set only while a flush writes the key
// or while it is journaled: a slot outlives its partition's activity, and
// at 10,000 partitions the two records inline were a third of a slot.
type slot struct {
	key     Key
	durable Record
	// inflight is the record the running flush writes for the key, in
	// the writer's buffer (Store.inflight); nil when no flush writes it.
	inflight *Record
	// synced is, while the key is journaled, what the checkpoint before
	// holds (nil if none).
	synced *Record
	marker *Marker
	// taken is the number of the flush that last took the key's queued
	// updates (Store.flushes).
	taken uint64
	// queuedAt is, while queued, the index of the key's updates in
	// Store.pending: they are kept there, not in the slot, as few keys
	// have updates queued at once.
	queuedAt int32

	hasDurable bool
	// journaled is set while the key is in Store.unsynced: durable in
	// the journal only.
	journaled bool
	// queued is set while the key has updates in Store.pending.
	queued bool
}

// queuedUpdate is a key's queued updates, merged into one patch.
type queuedUpdate struct {
	sl *slot
	p  patch
}

// queueLocked merges p into sl's queued updates, after those already
// queued; s.mu is held.
func (s *Store) queueLocked(sl *slot, p patch) {
	if sl.queued {
		q := &s.pending[sl.queuedAt]
		q.p = q.p.merge(p)
		return
	}
	sl.queuedAt, sl.queued = int32(len(s.pending)), true
	s.pending = append(s.pending, queuedUpdate{sl: sl, p: p})
}

// requeueLocked puts p, the updates of a flush that failed, back under
// any updates of sl queued since; s.mu is held.
func (s *Store) requeueLocked(sl *slot, p patch) {
	if sl.queued {
		q := &s.pending[sl.queuedAt]
		q.p = p.merge(q.p)
		return
	}
	s.queueLocked(sl, p)
}

// queuedPatchLocked returns sl's queued updates, if any; s.mu is held.
func (s *Store) queuedPatchLocked(sl *slot) (*patch, bool) {
	if sl == nil || !sl.queued {
		return nil, false
	}
	return &s.pending[sl.queuedAt].p, true
}

// Reserve makes room for n more keys with updates queued: an assignment
// of many partitions queues one update for each, and growing the key map
// and the queue an entry at a time cost milliseconds at 10,000.
func (s *Store) Reserve(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n > len(s.slots) {
		slots := make(map[Key]*slot, len(s.slots)+n)
		maps.Copy(slots, s.slots)
		s.slots = slots
	}
	if n > cap(s.pending)-len(s.pending) {
		s.pending = slices.Grow(s.pending, n)
	}
}

// slotLocked returns k's slot, made if k has none; s.mu is held.
func (s *Store) slotLocked(k Key) *slot {
	sl := s.slots[k]
	if sl == nil {
		sl = &slot{key: k}
		s.slots[k] = sl
	}
	return sl
}

// journaledLocked marks sl durable in the journal only, keeping what the
// last checkpoint holds for Synced; s.mu is held.
func (s *Store) journaledLocked(sl *slot) {
	sl.journaled, sl.synced = true, nil
	if sl.hasDurable {
		rec := sl.durable
		sl.synced = &rec
	}
	s.unsynced = append(s.unsynced, sl)
}

// syncedRecord is sl's record as of the last checkpoint, not cloned: what
// the checkpoint held while sl is journaled, else the durable one; false
// when sl is nil or has none. s.mu is held.
func (sl *slot) syncedRecord() (*Record, bool) {
	switch {
	case sl == nil:
		return nil, false
	case sl.journaled:
		return sl.synced, sl.synced != nil
	}
	return &sl.durable, sl.hasDurable
}

// durableRecord is sl's durable record, cloned; an empty one and false
// when sl is nil or has none.
func (sl *slot) durableRecord() (Record, bool) {
	if sl == nil || !sl.hasDurable {
		return emptyRecord(), false
	}
	return sl.durable.clone(), true
}
