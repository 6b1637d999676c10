package offsetfile

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// A partition's state is a key-value table kept in the offset file beside
// its record, in the bucket state/GROUP/TOPIC/PARTITION, out of reach of
// the records: a StateTx reads and changes one partition's table, and its
// Commit writes the changes and the partition's new watermark in one
// fsync-ed transaction. A crash therefore leaves every message's effect on
// the state exactly once: the watermark moves with the changes, never
// without them.

var stateBucket = []byte("state")

// A state value is stored after a format byte (stateValueV1), so that an
// empty value is told from an absent one and the format can grow.
const stateValueV1 = 0

// The limits of one state entry. bbolt allows keys of up to 32 KiB; a
// state meant to be read per message has no use for large keys, and a
// value over a mebibyte belongs in a store of its own.
const (
	MaxStateKey   = 4 << 10
	MaxStateValue = 1 << 20
)

// ErrStateRunEnded is returned by a StateTx used after its Commit or
// Discard, or by a read-only one (ViewState) asked to change.
var ErrStateRunEnded = errors.New("the state is not writable: its run ended or it is read-only")

// StateTx is one run's view of a partition's state: what the file holds,
// with the run's own changes over it. It is used by one goroutine, from
// BeginState to Commit or Discard, which must be called (Discard after
// Commit does nothing). Values returned by Get are valid until then.
type StateTx struct {
	s  *Store
	k  Key
	tx *bolt.Tx     // a read transaction, until the run ends
	b  *bolt.Bucket // the partition's table in tx; nil while it has none
	// cur is Get's, kept: bbolt's Bucket.Get makes a cursor each time.
	cur *bolt.Cursor
	// queued is the earlier runs' changes not yet in the file as of
	// BeginState (inflight, then pending: oldest first); idx finds a key
	// among them (nil: another run held it, and find asks each), and lo
	// is the oldest's seq.
	queued   stateRuns
	idx      *runIndex
	lo       uint64
	epoch    uint64
	changes  changeSet
	readOnly bool
	ended    bool
	// logged, first and restored are the run's changelog side
	// (LogChanges, Restored).
	logged   bool
	first    int64
	restored *ChangelogPosition
}

// LogChanges makes Commit append the run's changes to the partition's
// changelog outbox, in the same transaction, as of first (the source offset
// of the run's first message).
func (t *StateTx) LogChanges(first int64) { t.logged, t.first = true, first }

// Restored makes the run a restore's: Commit records pos as the
// partition's changelog position and empties its outbox, in the same
// transaction as the changes and the watermark. Its changes are not
// logged.
func (t *StateTx) Restored(pos ChangelogPosition) {
	pos.Markers = slices.Clone(pos.Markers)
	t.restored, t.logged = &pos, false
}

// stateRuns are committed runs' changes, oldest first.
type stateRuns []*stateRun

// stateRun is one committed run's changes, never modified after its
// commit.
type stateRun struct {
	seq     uint64 // the store's count of runs committed, this one's
	changes changeSet
	// logged runs append their changes to the outbox (outbox.go), as of
	// source offset first; a restore's run records restored instead.
	logged   bool
	first    int64
	restored *ChangelogPosition
}

// find returns the newest change of key, whose hash is h: its value (nil
// for a deletion) and whether a run changed it, asking each run, newest
// first. A run uses it only when another run of its partition held the
// index (runIndex).
func (r stateRuns) find(key []byte, h uint64) ([]byte, bool) {
	for i := len(r) - 1; i >= 0; i-- {
		if v, ok := r[i].changes.find(key, h); ok {
			return v, true
		}
	}
	return nil, false
}

// BeginState starts a run on k's state. The run holds a read transaction
// of the file until Commit or Discard: keep runs short (a long one delays
// the file's growth, not other writes), and end every one (Close waits for
// them).
func (s *Store) BeginState(k Key) (*StateTx, error) {
	const op = "begin state"
	if err := validateKey(k); err != nil {
		return nil, s.fileErr(op, err)
	}
	s.mu.Lock()
	switch {
	case s.readOnly:
		s.mu.Unlock()
		return nil, s.fileErr(op, ErrReadOnly)
	case s.closed:
		s.mu.Unlock()
		return nil, s.fileErr(op, ErrClosed)
	}
	// The queued runs first, then the read transaction: a checkpoint
	// that lands between the two is then in both, never in neither.
	var queued stateRuns
	if in, p := s.inflightState[k], s.pendingState[k]; len(in) > 0 || len(p) > 0 {
		queued = append(append(make(stateRuns, 0, len(in)+len(p)), in...), p...)
	}
	epoch := s.stateEpoch[k]
	idx := s.stateIndex[k]
	if idx == nil {
		if s.stateIndex == nil {
			s.stateIndex = map[Key]*runIndex{}
		}
		idx = &runIndex{}
		s.stateIndex[k] = idx
	}
	s.mu.Unlock()
	tx, err := s.db.Begin(false)
	if err != nil {
		return nil, s.fileErr(op, err)
	}
	t := &StateTx{s: s, k: k, tx: tx, b: stateTable(tx, k), queued: queued, epoch: epoch, lo: math.MaxUint64}
	if len(queued) > 0 {
		t.lo = queued[0].seq
		t.changes.sizeLike(&queued[len(queued)-1].changes)
		if idx.acquire() {
			idx.update(queued)
			t.idx = idx
		}
	}
	return t, nil
}

// FenceState ends the right of every run of k begun before it to commit:
// their Commit returns ErrStateRunEnded. A consumer calls it when it
// starts a partition, so that a run of an earlier assignment still in its
// handler (abandoned at a revoke) can never commit over the new one's.
func (s *Store) FenceState(k Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stateEpoch == nil {
		s.stateEpoch = map[Key]uint64{}
	}
	s.stateEpoch[k]++
	delete(s.stateIndex, k) // a fenced run may hold it still
}

// ViewState calls fn with k's state as the file holds it, read-only: Put
// and Delete return ErrStateRunEnded. It works on a store opened
// read-only too.
func (s *Store) ViewState(k Key, fn func(*StateTx) error) error {
	if err := validateKey(k); err != nil {
		return s.fileErr("view state", err)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return s.fileErr("view state", ErrClosed)
	}
	return s.db.View(func(tx *bolt.Tx) error {
		st := &StateTx{s: s, k: k, tx: tx, b: stateTable(tx, k), readOnly: true}
		defer func() { st.ended = true }()
		return fn(st)
	})
}

// stateTable is k's table in tx, nil if it has none.
func stateTable(tx *bolt.Tx, k Key) *bolt.Bucket {
	b := topicTable(tx, stateBucket, k)
	if b == nil {
		return nil
	}
	pk := partitionKey(k.Partition)
	return b.Bucket(pk[:])
}

// topicTable is the bucket root/GROUP/TOPIC of k in tx (root the state or
// the changelog bucket), which holds a bucket per partition; nil if none.
func topicTable(tx *bolt.Tx, root []byte, k Key) *bolt.Bucket {
	b := tx.Bucket(root)
	for _, name := range [][]byte{[]byte(k.Group), []byte(k.Topic)} {
		if b == nil {
			return nil
		}
		b = b.Bucket(name)
	}
	return b
}

func (t *StateTx) keyErr(op string, key []byte) error {
	switch {
	case key == nil:
		return fmt.Errorf("state %s of %s: nil key", op, keyString(t.k))
	case len(key) == 0:
		return fmt.Errorf("state %s of %s: empty key", op, keyString(t.k))
	case len(key) > MaxStateKey:
		return fmt.Errorf("state %s of %s: key of %d bytes, over the limit of %d (MaxStateKey)", op, keyString(t.k), len(key), MaxStateKey)
	}
	return nil
}

// Get returns key's value: nil, nil when absent.
func (t *StateTx) Get(key []byte) ([]byte, error) {
	if t.tx == nil || (t.ended && !t.readOnly) {
		return nil, ErrStateRunEnded
	}
	if err := t.keyErr("get", key); err != nil {
		return nil, err
	}
	h := keyHash(key)
	v, ok := t.changes.find(key, h)
	if !ok {
		v, ok = t.findQueued(key, h)
	}
	if ok {
		if v == nil {
			return nil, nil // deleted
		}
		return v[1:], nil
	}
	if t.b == nil {
		return nil, nil
	}
	if t.cur == nil {
		t.cur = t.b.Cursor()
	}
	k, v := t.cur.Seek(key)
	if v == nil || !bytes.Equal(k, key) {
		return nil, nil
	}
	return t.decode(key, v)
}

// findQueued returns the newest change of key, whose hash is h, among the
// queued runs: its value (nil for a deletion) and whether one changed it.
func (t *StateTx) findQueued(key []byte, h uint64) ([]byte, bool) {
	if t.idx == nil {
		return t.queued.find(key, h)
	}
	run, v, ok := t.idx.find(key, h)
	if !ok || run.seq < t.lo {
		return nil, false // the file holds it (stale), or no run changed it
	}
	return v, true
}

// decode returns the value stored as v.
func (t *StateTx) decode(key, v []byte) ([]byte, error) {
	if len(v) == 0 || v[0] != stateValueV1 {
		return nil, fmt.Errorf("state of %s in %s, key %q: %w: a value of an unknown format", keyString(t.k), t.s.path, truncName(key), ErrDamaged)
	}
	return v[1:len(v):len(v)], nil
}

// Put sets key to value (copied: the caller may reuse both).
func (t *StateTx) Put(key, value []byte) error {
	if t.ended || t.readOnly {
		return ErrStateRunEnded
	}
	if err := t.keyErr("put", key); err != nil {
		return err
	}
	if len(value) > MaxStateValue {
		return fmt.Errorf("state put of %s: value of %d bytes for key %q, over the limit of %d (MaxStateValue)",
			keyString(t.k), len(value), truncName(key), MaxStateValue)
	}
	if err := t.changes.set(key, keyHash(key), value, false); err != nil {
		return fmt.Errorf("state put of %s, key %q: %w", keyString(t.k), truncName(key), err)
	}
	return nil
}

// Reserve makes room for n more changes of size bytes of keys and values
// in all: for a run that knows how much it will change.
func (t *StateTx) Reserve(n, size int) {
	if n > 0 && size >= 0 && !t.ended && !t.readOnly {
		t.changes.reserve(n, size+n) // each value's format byte
	}
}

// Delete removes key; deleting an absent key is not an error.
func (t *StateTx) Delete(key []byte) error {
	if t.ended || t.readOnly {
		return ErrStateRunEnded
	}
	if err := t.keyErr("delete", key); err != nil {
		return err
	}
	if err := t.changes.set(key, keyHash(key), nil, true); err != nil {
		return fmt.Errorf("state delete of %s, key %q: %w", keyString(t.k), truncName(key), err)
	}
	return nil
}

// ForEach calls fn for every key and value in key order, the run's own
// changes included, until fn returns an error, which ForEach returns.
// fn may change the state; what it changes is not visited again.
func (t *StateTx) ForEach(fn func(key, value []byte) error) error {
	if t.tx == nil || (t.ended && !t.readOnly) {
		return ErrStateRunEnded
	}
	// The changes in key order, merged with the file's cursor; taken
	// before the first call, so fn's own changes do not move the walk.
	sets := make([]*changeSet, 0, len(t.queued)+1)
	for _, run := range t.queued {
		sets = append(sets, &run.changes)
	}
	changes := mergeChanges(append(sets, &t.changes)...)
	var ck, cv []byte
	var cur *bolt.Cursor
	if t.b != nil {
		cur = t.b.Cursor()
		ck, cv = cur.First()
	}
	i := 0
	for ck != nil || i < len(changes) {
		var key, value []byte
		switch {
		case ck != nil && (i == len(changes) || bytes.Compare(ck, changes[i].key) < 0):
			key = ck
			v, err := t.decode(ck, cv)
			if err != nil {
				return err
			}
			value = v
			ck, cv = cur.Next()
		default:
			c := changes[i]
			key = c.key
			if ck != nil && bytes.Equal(ck, key) {
				ck, cv = cur.Next() // the change replaces the file's value
			}
			i++
			if c.value == nil {
				continue // deleted
			}
			value = c.value[1:]
		}
		if err := fn(key, value); err != nil {
			return err
		}
	}
	return nil
}

// Discard ends the run without writing its changes.
func (t *StateTx) Discard() {
	if t.ended {
		return
	}
	t.ended = true
	t.changes = changeSet{}
	if t.idx != nil {
		t.idx.release()
		t.idx = nil
	}
	if t.tx != nil {
		_ = t.tx.Rollback()
		t.tx = nil
	}
}

// Commit ends the run: its changes and watermark (the next offset to
// handle, recorded by generation and member) are queued for the next
// checkpoint, which writes them in one fsync-ed transaction, with other
// partitions' runs (the writer's group commit). It returns at once: the
// next run of k reads them, and Store.Sync waits for them to be durable. A
// crash before that checkpoint loses the changes and the watermark
// together; a failed write is retried whole. It returns ErrStateRunEnded
// when ctx ended or the run was fenced (FenceState), and writes nothing then.
func (t *StateTx) Commit(ctx context.Context, watermark int64, generation int32, member string) error {
	if t.ended || t.readOnly {
		return ErrStateRunEnded
	}
	changes := t.changes
	logged, first, restored := t.logged, t.first, t.restored
	t.Discard()
	s := t.s
	const op = "commit state"
	p, err := s.watermarkPatch(op, t.k, watermark, generation, member)
	if err != nil {
		return err
	}
	// The changes join the queue with the watermark, under the same lock.
	return s.enqueueWith(op, t.k, p, func() error {
		if ctx.Err() != nil || s.stateEpoch[t.k] != t.epoch {
			// Under s.mu: a FenceState after this orders after the run.
			return fmt.Errorf("%s: %w (%v)", keyString(t.k), ErrStateRunEnded, cmp.Or(context.Cause(ctx), errFenced))
		}
		if len(changes.entries) > 0 || restored != nil {
			if s.pendingState == nil {
				s.pendingState = map[Key]stateRuns{}
			}
			s.runSeq++
			run := &stateRun{seq: s.runSeq, changes: changes, logged: logged, first: first, restored: restored}
			s.pendingState[t.k] = append(s.pendingState[t.k], run)
		}
		return nil
	})
}

var errFenced = errors.New("the partition was started again since the run began")

// writeState applies the runs' changes in tx.
func writeState(tx *bolt.Tx, state map[Key]stateRuns) error {
	if len(state) == 0 {
		return nil
	}
	if err := writeOutbox(tx, state); err != nil {
		return err
	}
	for k, runs := range state {
		sets := make([]*changeSet, len(runs))
		restore := false
		for i, run := range runs {
			sets[i] = &run.changes
			restore = restore || run.restored != nil
		}
		pk := partitionKey(k.Partition)
		b, err := createPath(tx, stateBucket, []byte(k.Group), []byte(k.Topic), pk[:])
		if err != nil {
			return fmt.Errorf("state of %s: %w", keyString(k), err)
		}
		if restore {
			// A restore writes a whole state in key order: full pages
			// halve what it writes (bbolt splits at half by default).
			b.FillPercent = 1.0
		}
		// In key order: bbolt writes them fastest so.
		for _, c := range mergeChanges(sets...) {
			if c.value == nil {
				err = b.Delete(c.key)
			} else {
				err = b.Put(c.key, c.value)
			}
			if err != nil {
				return fmt.Errorf("state of %s, key %q: %w", keyString(k), truncName(c.key), err)
			}
		}
	}
	return nil
}
