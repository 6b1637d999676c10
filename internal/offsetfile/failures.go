package offsetfile

import (
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// FailureAction is what a failure policy does with a message whose Handler
// keeps failing: framework.FailureAction is this type, and
// framework.FailurePolicy documents each action. A Failure records the two
// that give a message up, FailureSkip and FailureDeadLetter.
type FailureAction int

// Failure actions, in framework.FailurePolicy's order (the zero value
// retries).
const (
	// FailureRetry: retried forever; never recorded.
	FailureRetry FailureAction = iota
	// FailureDeadLetter: the message was written to a dead-letter topic
	// and acknowledged there before its offset was marked done.
	FailureDeadLetter
	// FailureSkip: the message was skipped; only this entry records it.
	FailureSkip
	// FailureStop: the message is held until resumed; never recorded.
	FailureStop
)

func (a FailureAction) String() string {
	switch a {
	case FailureRetry:
		return "retry"
	case FailureDeadLetter:
		return "dead-letter"
	case FailureSkip:
		return "skip"
	case FailureStop:
		return "stop"
	}
	return fmt.Sprintf("FailureAction(%d)", int(a))
}

// The action's byte in a failure entry, as written since the first
// version: the type's values are the policy's, the file's are its own.
const (
	actionByteSkipped      byte = 1
	actionByteDeadLettered byte = 2
)

// actionByte is a's byte in a failure entry; 0 for an action never
// recorded (validateFailure refuses those first).
func actionByte(a FailureAction) byte {
	switch a {
	case FailureSkip:
		return actionByteSkipped
	case FailureDeadLetter:
		return actionByteDeadLettered
	}
	return 0
}

// actionOfByte is actionByte's inverse; false for a byte no version
// writes.
func actionOfByte(b byte) (FailureAction, bool) {
	switch b {
	case actionByteSkipped:
		return FailureSkip, true
	case actionByteDeadLettered:
		return FailureDeadLetter, true
	}
	return 0, false
}

// Failure is one message a failure policy gave up on: skipped, or written
// to a dead-letter topic.
type Failure struct {
	Offset   int64
	At       time.Time // when the policy acted
	Action   FailureAction
	Attempts int32  // Handler calls made on the message
	Reason   string // the last Handler error, or why the crash-loop breaker tripped
	// DeadLetter is where the message was written, "topic/partition@offset";
	// empty for a skip.
	DeadLetter string
}

// failuresBucket holds Failure entries: failures/<group>/<topic>/<key>, the
// key being the partition (4 bytes) and offset (8 bytes), big-endian.
var failuresBucket = []byte("failures")

const failureVersion = 1

// RecordFailure queues f, a message the failure policy gave up on, and
// counts it in k's record (Skipped or DeadLettered). An offset is counted
// once: recording it again (a revoke during the dead-letter write, then the
// next owner gave up on it too) replaces its entry, and moves its count if
// the action changed. Like every update, it
// becomes durable with the next flush, in the same transaction as the
// watermark updates queued before it: a caller that records the failure
// and then moves the watermark past f.Offset never has the watermark
// durable without the entry. A zero f.At is set to now.
func (s *Store) RecordFailure(k Key, f Failure) error {
	const op = "record failure"
	if err := validateKey(k); err != nil {
		return s.fileErr(op, err)
	}
	if f.At.IsZero() {
		f.At = now()
	}
	if err := validateFailure(&f); err != nil {
		return s.fileErr(op, fmt.Errorf("%s: %w", keyString(k), err))
	}
	f.At = normTime(f.At)
	s.mu.Lock()
	cur, _ := s.latestLocked(k)
	prev, found := s.queuedFailureLocked(k, f.Offset)
	s.mu.Unlock()
	if !found {
		// Not queued nor being written: durable, if recorded before.
		var err error
		if prev, found, err = s.durableFailure(k, f.Offset); err != nil {
			return s.fileErr(op, err)
		}
	}
	// Only the partition's owner records its failures, one at a time, so
	// the count read above cannot be raced by another RecordFailure of k.
	p := patch{fields: setCounts, rec: Record{Skipped: cur.Skipped, DeadLettered: cur.DeadLettered}, failures: []Failure{f}}
	count := func(a FailureAction, d int64) {
		if a == FailureSkip {
			p.rec.Skipped = max(p.rec.Skipped+d, 0)
		} else {
			p.rec.DeadLettered = max(p.rec.DeadLettered+d, 0)
		}
	}
	if found {
		count(prev, -1)
	}
	count(f.Action, +1)
	return s.enqueue(op, k, p)
}

// queuedFailureLocked returns the action of the failure entry of k at
// offset that is queued or being flushed, if any; s.mu must be held.
func (s *Store) queuedFailureLocked(k Key, offset int64) (FailureAction, bool) {
	var a FailureAction
	found := false
	var queued []Failure
	if p, ok := s.queuedPatchLocked(s.slots[k]); ok {
		queued = p.failures
	}
	for _, list := range [][]Failure{s.inflightF[k], queued} {
		for _, f := range list {
			if f.Offset == offset {
				a, found = f.Action, true // the later one wins, as in the file
			}
		}
	}
	return a, found
}

// durableFailure returns the action of k's durable failure entry at offset,
// if any; an error when the entry, or the page that holds it, is damaged.
func (s *Store) durableFailure(k Key, offset int64) (FailureAction, bool, error) {
	var a FailureAction
	found := false
	err := protect(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			b := failureTopicBucket(tx, k.Group, k.Topic)
			if b == nil {
				return nil
			}
			fk := failureKey(k.Partition, offset)
			v := b.Get(fk[:])
			if v == nil {
				return nil
			}
			f, err := decodeFailure(fk[:], v)
			if err != nil {
				return fmt.Errorf("%s: failure entry in the %q bucket: %w", keyString(k), failuresBucket, err)
			}
			a, found = f.Action, true
			return nil
		})
	})
	if err != nil {
		return 0, false, fmt.Errorf("%s: reading the failure entry at offset %d: %w", keyString(k), offset, err)
	}
	return a, found, nil
}

// Failures returns the durable failure entries of k in offset order. It reads
// the file, so it fails after Close.
func (s *Store) Failures(k Key) ([]Failure, error) {
	const op = "failures"
	if err := validateKey(k); err != nil {
		return nil, s.fileErr(op, err)
	}
	var out []Failure
	err := protect(func() error {
		return s.db.View(func(tx *bolt.Tx) error {
			b := failureTopicBucket(tx, k.Group, k.Topic)
			if b == nil {
				return nil
			}
			pk := partitionKey(k.Partition)
			c := b.Cursor()
			for key, v := c.Seek(pk[:]); key != nil && len(key) >= 4 && string(key[:4]) == string(pk[:]); key, v = c.Next() {
				f, err := decodeFailure(key, v)
				if err != nil {
					return fmt.Errorf("%s: failure entry in the %q bucket: %w", keyString(k), failuresBucket, err)
				}
				out = append(out, f)
			}
			return nil
		})
	})
	if err != nil {
		return nil, s.fileErr(op, err)
	}
	return out, nil
}

func failureTopicBucket(tx *bolt.Tx, group, topic string) *bolt.Bucket {
	fb := tx.Bucket(failuresBucket)
	if fb == nil {
		return nil
	}
	gb := fb.Bucket([]byte(group))
	if gb == nil {
		return nil
	}
	return gb.Bucket([]byte(topic))
}

func validateFailure(f *Failure) error {
	switch {
	case f.Offset < 0:
		return fmt.Errorf("failure offset %d: must be >= 0", f.Offset)
	case f.Action != FailureSkip && f.Action != FailureDeadLetter:
		return fmt.Errorf("failure at offset %d: action %v is not recorded (only skip and dead-letter are)", f.Offset, f.Action)
	case f.Attempts < 0:
		return fmt.Errorf("failure at offset %d: negative attempts %d", f.Offset, f.Attempts)
	}
	if err := validateTime("failure time", f.At); err != nil {
		return err
	}
	if err := validateString("failure reason", f.Reason); err != nil {
		return err
	}
	return validateString("dead-letter position", f.DeadLetter)
}

func failureKey(partition int32, offset int64) [12]byte {
	var k [12]byte
	binary.BigEndian.PutUint32(k[:4], uint32(partition))
	binary.BigEndian.PutUint64(k[4:], uint64(offset))
	return k
}

// appendFailure encodes f (without its offset, which is in the key):
//
//	byte    version (1)
//	varint  At, Unix nanoseconds
//	byte    Action
//	varint  Attempts
//	uvarint len(Reason), Reason bytes
//	uvarint len(DeadLetter), DeadLetter bytes
func appendFailure(b []byte, f *Failure) []byte {
	b = append(b, failureVersion)
	b = binary.AppendVarint(b, f.At.UnixNano())
	b = append(b, actionByte(f.Action))
	b = binary.AppendVarint(b, int64(f.Attempts))
	b = appendString(b, f.Reason)
	return appendString(b, f.DeadLetter)
}

func decodeFailure(key, v []byte) (Failure, error) {
	if len(key) != 12 {
		return Failure{}, fmt.Errorf("key is %d bytes, want 12", len(key))
	}
	f := Failure{Offset: int64(binary.BigEndian.Uint64(key[4:]))}
	if len(v) < 1 {
		return f, errTruncated
	}
	if v[0] != failureVersion {
		return f, fmt.Errorf("unknown failure encoding version %d (this build reads %d)", v[0], failureVersion)
	}
	d := decoder{b: v[1:]}
	f.At = d.time("failure time")
	ab := d.byte("failure action")
	f.Attempts = d.int32("failure attempts")
	f.Reason = d.string("failure reason")
	f.DeadLetter = d.string("dead-letter position")
	if d.err != nil {
		return f, fmt.Errorf("offset %d: %w", f.Offset, d.err)
	}
	if len(d.b) != 0 {
		return f, fmt.Errorf("offset %d: %d unexpected trailing bytes", f.Offset, len(d.b))
	}
	a, ok := actionOfByte(ab)
	if !ok && f.Offset >= 0 { // a bad offset is named first, as validateFailure does
		return f, fmt.Errorf("failure at offset %d: unknown action %d", f.Offset, ab)
	}
	f.Action = a
	if err := validateFailure(&f); err != nil {
		return f, err
	}
	return f, nil
}

// writeFailures puts the failure entries of writes into their buckets,
// then prunes each partition written to its newest keep entries (keep < 0:
// no pruning), deleting only entries below the partition's watermark. A
// partition whose watermark moved, with more failures ever than keep, is
// pruned too: its entries may have been written by an earlier flush, while
// they were not below the watermark yet.
func writeFailures(tx *bolt.Tx, writes []pendingWrite, keep int) error {
	var root *bolt.Bucket
	for _, w := range writes {
		if w.patch == nil {
			continue // a record rewritten, with no updates
		}
		moved := keep >= 0 && w.patch.fields&setWatermark != 0 && w.rec.Skipped+w.rec.DeadLettered > int64(keep)
		if len(w.patch.failures) == 0 && !moved {
			continue
		}
		if root == nil {
			var err error
			if root, err = tx.CreateBucketIfNotExists(failuresBucket); err != nil {
				return err
			}
		}
		gb, err := root.CreateBucketIfNotExists([]byte(w.key.Group))
		if err != nil {
			return fmt.Errorf("failures of group %q: %w", w.key.Group, err)
		}
		tb, err := gb.CreateBucketIfNotExists([]byte(w.key.Topic))
		if err != nil {
			return fmt.Errorf("failures of group %q topic %q: %w", w.key.Group, w.key.Topic, err)
		}
		for i := range w.patch.failures {
			f := &w.patch.failures[i]
			k := failureKey(w.key.Partition, f.Offset)
			// bbolt keeps the value until the transaction ends: one buffer each.
			if err := tb.Put(k[:], appendFailure(nil, f)); err != nil {
				return fmt.Errorf("%s: failure at offset %d: %w", keyString(w.key), f.Offset, err)
			}
		}
		if keep >= 0 {
			if err := pruneFailures(tb, w.key.Partition, w.rec.Watermark, keep); err != nil {
				return fmt.Errorf("%s: pruning failure entries: %w", keyString(w.key), err)
			}
		}
	}
	return nil
}

// pruneFailures deletes the oldest failure entries of partition in tb
// beyond the newest keep, stopping at the first one not below watermark.
func pruneFailures(tb *bolt.Bucket, partition int32, watermark int64, keep int) error {
	pk := partitionKey(partition)
	inPart := func(k []byte) bool { return k != nil && len(k) >= 4 && string(k[:4]) == string(pk[:]) }
	c := tb.Cursor()
	n := 0
	for k, _ := c.Seek(pk[:]); inPart(k); k, _ = c.Next() {
		n++
	}
	for k, _ := c.Seek(pk[:]); inPart(k) && n > keep; k, _ = c.Seek(pk[:]) {
		if len(k) != 12 || int64(binary.BigEndian.Uint64(k[4:])) >= watermark {
			return nil
		}
		if err := c.Delete(); err != nil {
			return err
		}
		n--
	}
	return nil
}
