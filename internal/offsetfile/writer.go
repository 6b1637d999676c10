package offsetfile

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
)

// run is the writer goroutine: it folds every pending update into one
// flush (group commit) until Close, then checkpoints once more. A flush is
// a journal entry or a checkpoint (journal.go).
func (s *Store) run() {
	clean := false
	defer func() {
		if s.j != nil {
			if err := s.j.close(clean); err != nil {
				s.log.Warn("closing the journal failed", zap.Error(err))
			}
		}
		s.mu.Lock()
		s.stopped = true
		s.notifyLocked()
		s.mu.Unlock()
		close(s.done)
	}()
	var (
		timer   = time.NewTimer(time.Hour)
		sync    = time.NewTimer(time.Hour) // the next checkpoint of journaled updates
		last    time.Time                  // start of the last flush
		backoff time.Duration
	)
	timer.Stop()
	sync.Stop()
	defer timer.Stop()
	defer sync.Stop()
	final := func() {
		_, err := s.flush(true)
		clean = err == nil
	}
	wait := func(d time.Duration) bool { // false if Close was called
		if d <= 0 {
			return true
		}
		timer.Reset(d)
		select {
		case <-timer.C:
			return true
		case <-s.stop:
			return false
		}
	}
	for {
		select {
		case <-s.kick:
		case <-sync.C:
		case <-s.stop:
			final()
			return
		}
		// Busy: after a flush that wrote, the writer looks again one
		// interval later, and the updates queued meanwhile wait for it
		// without waking it (kicked stays set): one wakeup per flush, not
		// a kick and then the interval's timer.
		for {
			if s.interval > 0 && !last.IsZero() {
				if !wait(time.Until(last.Add(s.interval))) {
					final()
					return
				}
			}
			prev := last
			last = time.Now()
			wrote, err := s.flush(false)
			if due, ok := s.syncDue(); ok {
				sync.Reset(time.Until(due))
			}
			if err != nil {
				backoff = min(max(2*backoff, minBackoff), maxBackoff)
				if !wait(backoff) {
					final()
					return
				}
				select { // retry even if nothing new is queued
				case s.kick <- struct{}{}:
				default:
				}
				break
			}
			backoff = 0
			if !wrote {
				last = prev // nothing written: the next update need not wait for this look
				break
			}
			if s.interval <= 0 {
				break // no interval: each write as soon as updates are pending
			}
		}
	}
}

// syncDue returns when the journaled updates are due for a checkpoint; ok
// is false when there are none.
func (s *Store) syncDue() (due time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.unsynced) == 0 {
		return time.Time{}, false
	}
	return s.lastSync.Add(s.syncInterval), true
}

type pendingWrite struct {
	key Key
	sl  *slot // key's slot
	// patch is the updates the write carries, in the flush's list of
	// taken updates; nil for a journaled key a checkpoint rewrites.
	patch *patch
	// rec is what is written: the slot's inflight record (patch applied to
	// the durable one), or its durable one when a checkpoint rewrites a
	// journaled key. Only the flush writes either, so the flush reads them
	// outside the lock; a pointer, as a Record is most of a write's size.
	rec   *Record
	value []byte
}

// flush writes everything pending: appended to the journal, or in a
// checkpoint when one is due (always without a journal, and when final).
// On failure the updates go back to pending, under any newer updates of the
// same keys. wrote is false when there was nothing to write: the writer
// goes idle, and the next update wakes it.
func (s *Store) flush(final bool) (wrote bool, err error) {
	s.mu.Lock()
	s.kicked = false
	t := now()
	for _, m := range s.dirtyMarkers {
		s.foldLocked(m, t)
	}
	clear(s.dirtyMarkers)
	s.dirtyMarkers = s.dirtyMarkers[:0]
	checkpoint := final || s.j == nil || s.j.broken || s.j.size >= maxJournalBytes || s.syncWant > s.syncedSeq ||
		(len(s.unsynced) > 0 && time.Since(s.lastSync) >= s.syncInterval) || len(s.pendingState) > 0 || len(s.pendingImports) > 0
	if len(s.pending) == 0 && len(s.pendingImports) == 0 && (!checkpoint || len(s.unsynced) == 0) {
		// Every update counted is durable, or folded to nothing (a
		// Progress with no watermark yet): Flush callers need not wait.
		notify := false
		if s.flushedSeq < s.seq {
			s.flushedSeq, notify = s.seq, true
		}
		if len(s.unsynced) == 0 && s.syncedSeq < s.seq {
			s.syncedSeq, notify = s.seq, true
		}
		if notify {
			s.notifyLocked()
		}
		s.mu.Unlock()
		return false, nil
	}
	// The writer looks again after its interval (run): the updates queued
	// until then need not wake it.
	s.kicked = s.interval > 0
	// The maps and buffers of a flush are reused by the next one: at
	// 10,000 partitions they are most of a flush's allocations.
	taken, state, imports := s.pending, s.pendingState, s.pendingImports
	s.pending, s.spare, s.pendingState, s.inflightState, s.pendingImports = s.spare[:0], nil, nil, state, nil
	s.flushes++
	flushN := s.flushes
	seq := s.seq
	hook := s.testHook
	writes := s.writes[:0]
	// Sized before the first write points into it: it never moves while
	// the flush runs.
	inflight := s.inflight[:0]
	if cap(inflight) < len(taken) {
		inflight = make([]Record, 0, len(taken))
	}
	for i := range taken {
		sl, p := taken[i].sl, &taken[i].p
		k := sl.key
		sl.queued, sl.taken = false, flushN
		if len(p.failures) > 0 {
			if s.inflightF == nil {
				s.inflightF = make(map[Key][]Failure)
			}
			s.inflightF[k] = p.failures
			checkpoint = true // failure entries live in the file only
		}
		base := sl.durable
		if !sl.hasDurable {
			base = emptyRecord()
		}
		inflight = append(inflight, p.apply(base))
		sl.inflight = &inflight[len(inflight)-1]
		writes = append(writes, pendingWrite{key: k, sl: sl, patch: p, rec: sl.inflight})
	}
	updated := len(writes) // the records this flush changes (a checkpoint rewrites more)
	if checkpoint {
		writes = s.unsyncedLocked(writes, flushN)
	}
	s.mu.Unlock()
	defer func() {
		s.spare = emptied(taken)
		s.writes = emptied(writes)
		s.inflight = emptied(inflight)
	}()

	began := time.Now()
	if !checkpoint {
		s.encode(writes)
		if err = s.j.append(writes); err != nil {
			s.log.Warn("appending to the journal failed; checkpointing instead", zap.Error(err))
			checkpoint = true
			s.mu.Lock()
			writes = s.unsyncedLocked(writes, flushN)
			s.mu.Unlock()
		}
	}
	if checkpoint {
		s.order = sortWrites(writes, s.order)
		s.encode(writes)
		err = s.checkpoint(writes, state, imports, hook)
	}
	if s.onFlush != nil {
		s.onFlush(time.Since(began), updated, err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range writes {
		writes[i].sl.inflight = nil // the write still points at it, until the flush returns
	}
	s.inflightF = nil
	s.inflightState = nil
	if err != nil {
		for k, runs := range state {
			// Queued again, before any newer run of k (in a new list: a
			// run may hold either).
			if s.pendingState == nil {
				s.pendingState = map[Key]stateRuns{}
			}
			s.pendingState[k] = append(slices.Clip(runs), s.pendingState[k]...)
		}
		s.pendingImports = append(imports, s.pendingImports...)
		for _, w := range writes {
			sl := w.sl
			if sl.taken != flushN {
				continue // journaled before: still unsynced
			}
			s.requeueLocked(sl, *w.patch)
		}
		first := s.flushErr == nil
		s.flushErr = s.fileErr("flush", fmt.Errorf("writing %d records: %w", len(writes), err))
		s.notifyLocked()
		if first {
			s.log.Error("flush failed; updates stay queued and will be retried", zap.Error(err), zap.Int("records", len(writes)))
		} else {
			s.log.Debug("flush retry failed", zap.Error(err))
		}
		return true, err
	}
	for i := range writes {
		w := &writes[i]
		sl := w.sl
		if !checkpoint && !sl.journaled {
			// The first journaling since the checkpoint: keep what
			// the checkpoint holds, for Synced.
			s.journaledLocked(sl)
		}
		sl.durable, sl.hasDurable = *w.rec, true
		if m := sl.marker; m != nil {
			m.setDurable(w.rec)
		}
	}
	s.flushedSeq = seq
	for k := range state {
		if len(s.pendingState[k]) == 0 {
			// Every run of k is in the file: its index holds only stale
			// entries, which would keep the runs' changes in memory.
			delete(s.stateIndex, k)
		}
	}
	if checkpoint {
		for i, sl := range s.unsynced {
			sl.journaled, sl.synced = false, nil
			s.unsynced[i] = nil
		}
		s.unsynced = s.unsynced[:0]
		s.syncedSeq = seq
		s.lastSync = began
	}
	if s.flushErr != nil {
		s.log.Info("flush succeeded after earlier failures", zap.Int("records", len(writes)))
		s.flushErr = nil
	}
	s.notifyLocked()
	return true, nil
}

// emptied returns a flush's buffer cleared (no records kept alive by it)
// for the next flush, or nil if the next would use little of it: a flush
// of every key at a 10,000-partition assignment should not leave its
// buffers to the few-key flushes after it.
func emptied[T any](buf []T) []T {
	clear(buf)
	if cap(buf) > 1024 && cap(buf) > 4*len(buf) {
		return nil
	}
	return buf[:0]
}

// unsyncedLocked adds to writes the journaled records that a checkpoint
// must write too: those of s.unsynced not taken from pending by flush
// number flushN.
func (s *Store) unsyncedLocked(writes []pendingWrite, flushN uint64) []pendingWrite {
	for _, sl := range s.unsynced {
		if sl.taken != flushN {
			writes = append(writes, pendingWrite{key: sl.key, sl: sl, rec: &sl.durable})
		}
	}
	return writes
}

// sortWrites sorts writes by key, as bbolt writes keys in order fastest.
// A pendingWrite is a few hundred bytes: it sorts the indexes (order, a
// buffer it returns for reuse), then moves each write once.
func sortWrites(writes []pendingWrite, order []int32) []int32 {
	order = order[:0]
	for i := range writes {
		order = append(order, int32(i))
	}
	slices.SortFunc(order, func(a, b int32) int { return compareKeys(writes[a].key, writes[b].key) })
	// writes[i] takes writes[order[i]]: follow each cycle of the
	// permutation, marking the places filled with -1.
	for i := range order {
		if order[i] < 0 || int(order[i]) == i {
			continue
		}
		hold := writes[i]
		j := i
		for {
			k := int(order[j])
			order[j] = -1
			if k == i {
				writes[j] = hold
				break
			}
			writes[j] = writes[k]
			j = k
		}
	}
	return order
}

// encodeWrites encodes each write's record into its value, in buf, and
// returns buf.
func encodeWrites(buf []byte, writes []pendingWrite) []byte {
	buf = buf[:0]
	for i := range writes {
		start := len(buf)
		buf = appendRecord(buf, writes[i].rec)
		writes[i].value = buf[start:len(buf):len(buf)]
	}
	return buf
}

// encode is encodeWrites in the writer's buffer.
func (s *Store) encode(writes []pendingWrite) { s.encoded = encodeWrites(s.encoded, writes) }

// checkpoint writes writes, the runs' state changes and the imported
// states into the file in one fsync-ed transaction, with the journal's
// next generation, and then empties the journal.
func (s *Store) checkpoint(writes []pendingWrite, state map[Key]stateRuns, imports []stateImport, hook func(*bolt.Tx) error) error {
	var gen uint64
	if s.j != nil {
		gen = s.j.newGeneration()
	}
	// protect: a page damaged since Open makes bbolt panic in this
	// goroutine; Update rolls the transaction back as the panic unwinds,
	// and the flush fails like any other.
	err := protect(func() error {
		return s.db.Update(func(tx *bolt.Tx) error {
			if hook != nil {
				if err := hook(tx); err != nil {
					return err
				}
			}
			if err := writeRecords(tx, writes); err != nil {
				return err
			}
			if err := writeFailures(tx, writes, s.keepFails); err != nil {
				return err
			}
			if err := writeState(tx, state); err != nil {
				return err
			}
			if err := writeImports(tx, imports); err != nil {
				return err
			}
			if gen == 0 {
				return nil
			}
			return tx.Bucket(metaBucket).Put(journalKey, binary.BigEndian.AppendUint64(nil, gen))
		})
	})
	if err != nil || s.j == nil {
		return err
	}
	if err := s.j.reset(gen); err != nil {
		// The checkpoint holds: the journal's entries are stale now. Until
		// a reset succeeds every flush checkpoints.
		s.log.Warn("emptying the journal failed; checkpointing every flush until it succeeds", zap.Error(err))
	}
	return nil
}

// notifyLocked wakes every Flush waiting for a flush attempt to end.
func (s *Store) notifyLocked() {
	close(s.flushed)
	s.flushed = make(chan struct{})
}

// writeRecords puts the records, sorted by key, into their buckets.
func writeRecords(tx *bolt.Tx, writes []pendingWrite) error {
	groups, err := tx.CreateBucketIfNotExists(groupsBucket)
	if err != nil {
		return err
	}
	var (
		gb, tb       *bolt.Bucket
		group, topic string
	)
	for _, w := range writes {
		if gb == nil || w.key.Group != group {
			if gb, err = groups.CreateBucketIfNotExists([]byte(w.key.Group)); err != nil {
				return fmt.Errorf("group %q: %w", w.key.Group, err)
			}
			group, tb = w.key.Group, nil
		}
		if tb == nil || w.key.Topic != topic {
			if tb, err = gb.CreateBucketIfNotExists([]byte(w.key.Topic)); err != nil {
				return fmt.Errorf("group %q topic %q: %w", w.key.Group, w.key.Topic, err)
			}
			topic = w.key.Topic
		}
		pk := partitionKey(w.key.Partition)
		if err := tb.Put(pk[:], w.value); err != nil {
			return fmt.Errorf("%s: %w", keyString(w.key), err)
		}
	}
	return nil
}
