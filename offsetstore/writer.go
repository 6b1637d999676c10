package offsetstore

import (
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
)

// run is the writer goroutine: it folds every pending update into one bbolt
// transaction per flush (group commit) until Close, then flushes once more.
func (s *Store) run() {
	defer func() {
		s.mu.Lock()
		s.stopped = true
		s.notifyLocked()
		s.mu.Unlock()
		close(s.done)
	}()
	var (
		timer   = time.NewTimer(time.Hour)
		last    time.Time // start of the last flush
		backoff time.Duration
	)
	timer.Stop()
	defer timer.Stop()
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
		case <-s.stop:
			s.flush()
			return
		}
		if s.interval > 0 && !last.IsZero() {
			if !wait(time.Until(last.Add(s.interval))) {
				s.flush()
				return
			}
		}
		last = time.Now()
		if err := s.flush(); err != nil {
			backoff = min(max(2*backoff, minBackoff), maxBackoff)
			if !wait(backoff) {
				s.flush()
				return
			}
			select { // retry even if nothing new is queued
			case s.kick <- struct{}{}:
			default:
			}
		} else {
			backoff = 0
		}
	}
}

type pendingWrite struct {
	key   Key
	patch patch
	rec   Record // patch applied to the durable record
	value []byte
}

// flush writes everything pending in one transaction. On failure the
// updates go back to pending, under any newer updates of the same keys.
func (s *Store) flush() error {
	s.mu.Lock()
	s.kicked = false
	for _, m := range s.dirtyMarkers {
		s.foldLocked(m)
	}
	clear(s.dirtyMarkers)
	s.dirtyMarkers = s.dirtyMarkers[:0]
	if len(s.pending) == 0 {
		// Every update counted is durable, or folded to nothing (a
		// Progress with no watermark yet): Flush callers need not wait.
		if s.flushedSeq < s.seq {
			s.flushedSeq = s.seq
			s.notifyLocked()
		}
		s.mu.Unlock()
		return nil
	}
	taken := s.pending
	s.pending = make(map[Key]patch, len(taken))
	seq := s.seq
	hook := s.testHook
	writes := make([]pendingWrite, 0, len(taken))
	s.inflight = make(map[Key]Record, len(taken))
	s.inflightF = make(map[Key][]Failure)
	for k, p := range taken {
		if len(p.failures) > 0 {
			s.inflightF[k] = p.failures
		}
		base, ok := s.durable[k]
		if !ok {
			base = emptyRecord()
		}
		rec := p.apply(base)
		writes = append(writes, pendingWrite{key: k, patch: p, rec: rec})
		s.inflight[k] = rec
	}
	s.mu.Unlock()

	slices.SortFunc(writes, func(a, b pendingWrite) int { return compareKeys(a.key, b.key) })
	var buf []byte
	for i := range writes {
		start := len(buf)
		buf = appendRecord(buf, &writes[i].rec)
		writes[i].value = buf[start:len(buf):len(buf)]
	}
	began := time.Now()
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
			return writeFailures(tx, writes, s.keepFails)
		})
	})
	if s.onFlush != nil {
		s.onFlush(time.Since(began), len(writes), err)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight, s.inflightF = nil, nil
	if err != nil {
		for _, w := range writes {
			if newer, ok := s.pending[w.key]; ok {
				s.pending[w.key] = w.patch.merge(newer)
			} else {
				s.pending[w.key] = w.patch
			}
		}
		first := s.flushErr == nil
		s.flushErr = s.fileErr("flush", fmt.Errorf("writing %d records: %w", len(writes), err))
		s.notifyLocked()
		if first {
			s.log.Error("flush failed; updates stay queued and will be retried", zap.Error(err), zap.Int("records", len(writes)))
		} else {
			s.log.Debug("flush retry failed", zap.Error(err))
		}
		return err
	}
	for _, w := range writes {
		s.durable[w.key] = w.rec
		if m := s.markers[w.key]; m != nil {
			m.setDurable(&w.rec)
		}
	}
	s.flushedSeq = seq
	if s.flushErr != nil {
		s.log.Info("flush succeeded after earlier failures", zap.Int("records", len(writes)))
		s.flushErr = nil
	}
	s.notifyLocked()
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
