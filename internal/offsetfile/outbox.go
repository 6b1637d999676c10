package offsetfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// The changelog's side of a partition's state: an outbox of the changes
// not yet acknowledged by the changelog topic, and where the changelog
// stands. A run whose changes are logged (StateTx.LogChanges) appends
// them to its partition's outbox in the checkpoint that writes the
// changes and the watermark: a crash loses none, and the changelog writer
// sends only what is durable. The bucket is changelog/GROUP/TOPIC/PARTITION:
// each run's entries in one record under the 8-byte sequence number of its
// first, the position under positionKey.

var changelogBucket = []byte("changelog")

// positionKey holds a partition's ChangelogPosition; entries' keys are 8
// bytes, so it never meets one.
var positionKey = []byte("p")

// nextSeqKey holds the next entry's sequence number: entries are
// numbered on, never again from 0 once the outbox empties.
var nextSeqKey = []byte("n")

// The formats of an outbox record and of a position. An outbox record is
// one entry (outboxEntryV1, as files before the run records hold them,
// and as import writes them) or a run's entries (outboxRunV1), numbered
// on from its key: one bbolt write per run, not per change, which made a
// logged run's checkpoint twice as costly as its state's.
const (
	outboxEntryV1 = 0
	outboxRunV1   = 1
	positionV1    = 0
)

// An OutboxEntry is one change of a logged run, waiting for the changelog.
type OutboxEntry struct {
	Seq    uint64 // its place in the partition's outbox, increasing
	Offset int64  // the source offset of the run's first message
	Key    []byte
	Value  []byte // nil with Delete
	Delete bool
}

// A ChangelogMarker is an owner's start as its changelog records it: the
// marker record at changelog offset Epoch (the owner's epoch), resuming the
// partition at source offset Start.
type ChangelogMarker struct {
	Epoch, Start int64
}

// ChangelogPosition is where a partition's changelog stands for this file.
type ChangelogPosition struct {
	// Epoch and Start are this file's owner's marker: -1 when it has none.
	Epoch, Start int64
	// Next is the changelog offset after the last record this file wrote
	// and saw acknowledged (or restored up to): an incremental restore
	// reads from there.
	Next int64
	// Acked is the source offset of the last acknowledged change: -1
	// when none.
	Acked int64
	// Gap is set once a write of this file's owner landed elsewhere than
	// at Next: another writer wrote in between, and this file's state is
	// not the changelog's any more.
	Gap bool
	// Markers are the owners' markers at changelog offsets below Next,
	// oldest first: the fencing rule needs them for the records above.
	Markers []ChangelogMarker
}

// NoChangelogPosition is the position of a partition the changelog never
// wrote for.
func NoChangelogPosition() ChangelogPosition {
	return ChangelogPosition{Epoch: -1, Start: -1, Next: 0, Acked: -1}
}

func appendPosition(b []byte, p ChangelogPosition) []byte {
	b = append(b, positionV1)
	for _, v := range []int64{p.Epoch, p.Start, p.Next, p.Acked} {
		b = binary.AppendVarint(b, v)
	}
	if p.Gap {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(p.Markers)))
	for _, m := range p.Markers {
		b = binary.AppendVarint(b, m.Epoch)
		b = binary.AppendVarint(b, m.Start)
	}
	return b
}

var errShortValue = errors.New("truncated")

func decodePosition(v []byte) (ChangelogPosition, error) {
	if len(v) == 0 || v[0] != positionV1 {
		return ChangelogPosition{}, errors.New("a position of an unknown format")
	}
	v = v[1:]
	var p ChangelogPosition
	ints := []*int64{&p.Epoch, &p.Start, &p.Next, &p.Acked}
	for _, f := range ints {
		x, n := binary.Varint(v)
		if n <= 0 {
			return ChangelogPosition{}, errShortValue
		}
		*f, v = x, v[n:]
	}
	if len(v) == 0 {
		return ChangelogPosition{}, errShortValue
	}
	p.Gap, v = v[0] == 1, v[1:]
	count, n := binary.Uvarint(v)
	if n <= 0 || count > uint64(len(v)) {
		return ChangelogPosition{}, errShortValue
	}
	v = v[n:]
	for range count {
		e, n := binary.Varint(v)
		if n <= 0 {
			return ChangelogPosition{}, errShortValue
		}
		v = v[n:]
		s, n := binary.Varint(v)
		if n <= 0 {
			return ChangelogPosition{}, errShortValue
		}
		v = v[n:]
		p.Markers = append(p.Markers, ChangelogMarker{Epoch: e, Start: s})
	}
	return p, nil
}

// appendRun appends the outbox record of a run's changes cs, the run
// starting at source offset offset.
func appendRun(b []byte, offset int64, cs []change) []byte {
	b = append(b, outboxRunV1)
	b = binary.BigEndian.AppendUint64(b, uint64(offset))
	b = binary.AppendUvarint(b, uint64(len(cs)))
	for _, c := range cs {
		if c.value == nil {
			b = append(b, 1)
		} else {
			b = append(b, 0)
		}
		b = binary.AppendUvarint(b, uint64(len(c.key)))
		b = append(b, c.key...)
		if c.value != nil {
			b = binary.AppendUvarint(b, uint64(len(c.value)-1))
			b = append(b, c.value[1:]...) // without the state's format byte
		}
	}
	return b
}

// entryChanges is the changes of entries es, as appendRun takes them.
func entryChanges(es []OutboxEntry) []change {
	cs := make([]change, len(es))
	for i, e := range es {
		cs[i] = change{key: e.Key}
		if !e.Delete {
			cs[i].value = append([]byte{stateValueV1}, e.Value...)
		}
	}
	return cs
}

// runSize is the length of appendRun's record of cs.
func runSize(cs []change) int {
	n := 1 + 8 + binary.MaxVarintLen64
	for _, c := range cs {
		n += 1 + 2*binary.MaxVarintLen64 + len(c.key) + len(c.value)
	}
	return n
}

// recordEntries is how many entries an outbox record holds, read from its
// head alone.
func recordEntries(v []byte) (uint64, error) {
	switch {
	case len(v) >= 10 && v[0] == outboxEntryV1:
		return 1, nil
	case len(v) >= 10 && v[0] == outboxRunV1:
		n, k := binary.Uvarint(v[9:])
		if k <= 0 || n == 0 {
			return 0, errShortValue
		}
		return n, nil
	}
	return 0, errors.New("an outbox record of an unknown format")
}

// decodeEntries appends the entries of the outbox record v, under key seq,
// to out. Their keys and values share one copy of v.
func decodeEntries(out []OutboxEntry, seq uint64, v []byte) ([]OutboxEntry, error) {
	if _, err := recordEntries(v); err != nil {
		return out, err
	}
	v = slices.Clone(v)
	offset := int64(binary.BigEndian.Uint64(v[1:9]))
	if v[0] == outboxEntryV1 {
		e := OutboxEntry{Seq: seq, Offset: offset, Delete: v[9] == 1}
		v = v[10:]
		n, k := binary.Uvarint(v)
		if k <= 0 || n > uint64(len(v)-k) {
			return out, errShortValue
		}
		v = v[k:]
		e.Key = v[:n:n]
		if !e.Delete {
			e.Value = v[n:]
		}
		return append(out, e), nil
	}
	count, k := binary.Uvarint(v[9:])
	v = v[9+k:]
	for i := range count {
		if len(v) == 0 || v[0] > 1 {
			return out, errShortValue
		}
		e := OutboxEntry{Seq: seq + i, Offset: offset, Delete: v[0] == 1}
		v = v[1:]
		n, k := binary.Uvarint(v)
		if k <= 0 || n > uint64(len(v)-k) {
			return out, errShortValue
		}
		e.Key, v = v[k:k+int(n):k+int(n)], v[k+int(n):]
		if !e.Delete {
			n, k := binary.Uvarint(v)
			if k <= 0 || n > uint64(len(v)-k) {
				return out, errShortValue
			}
			e.Value, v = v[k:k+int(n):k+int(n)], v[k+int(n):]
		}
		out = append(out, e)
	}
	if len(v) != 0 {
		return out, fmt.Errorf("%d bytes after an outbox record's %d entries", len(v), count)
	}
	return out, nil
}

// changelogTable is k's bucket in tx, created when create is set; nil if
// it has none.
func changelogTable(tx *bolt.Tx, k Key, create bool) (*bolt.Bucket, error) {
	pk := partitionKey(k.Partition)
	if !create {
		if b := topicTable(tx, changelogBucket, k); b != nil {
			return b.Bucket(pk[:]), nil
		}
		return nil, nil
	}
	b, err := createPath(tx, changelogBucket, []byte(k.Group), []byte(k.Topic), pk[:])
	if err != nil {
		return nil, fmt.Errorf("changelog outbox of %s: %w", keyString(k), err)
	}
	return b, nil
}

// writeOutbox appends the logged runs' changes to their partitions'
// outboxes in tx, run after run (each run's keys in the order it first
// changed them), and records the position a restore's run carries
// (emptying the outbox first: what it held was of an earlier ownership,
// which the restored state replaces).
func writeOutbox(tx *bolt.Tx, state map[Key]stateRuns) error {
	// The entries' values share one arena: bbolt keeps a value until the
	// transaction commits (a key it copies), and a slice of an arena that
	// grew still holds the old array.
	var arena []byte
	var key [8]byte
	for k, runs := range state {
		var b *bolt.Bucket
		var next uint64
		for _, run := range runs {
			if !run.logged && run.restored == nil {
				continue
			}
			if b == nil {
				var err error
				if b, err = changelogTable(tx, k, true); err != nil {
					return err
				}
				// Entries are appended in sequence: full pages halve
				// what a checkpoint writes (bbolt splits at half).
				b.FillPercent = 1.0
				if v := b.Get(nextSeqKey); len(v) == 8 {
					next = binary.BigEndian.Uint64(v)
				}
			}
			if run.restored != nil {
				if err := clearOutbox(b); err != nil {
					return fmt.Errorf("changelog outbox of %s: %w", keyString(k), err)
				}
				if err := b.Put(positionKey, appendPosition(nil, *run.restored)); err != nil {
					return fmt.Errorf("changelog position of %s: %w", keyString(k), err)
				}
				continue
			}
			cs := run.changes.changes() // one run: each key once
			if len(cs) == 0 {
				continue
			}
			if size := runSize(cs); cap(arena)-len(arena) < size {
				arena = make([]byte, 0, max(64<<10, size))
			}
			at := len(arena)
			arena = appendRun(arena, run.first, cs)
			binary.BigEndian.PutUint64(key[:], next)
			if err := b.Put(key[:], arena[at:len(arena):len(arena)]); err != nil {
				return fmt.Errorf("changelog outbox of %s: %w", keyString(k), err)
			}
			next += uint64(len(cs))
		}
		if b != nil {
			if err := b.Put(nextSeqKey, binary.BigEndian.AppendUint64(nil, next)); err != nil {
				return fmt.Errorf("changelog outbox of %s: %w", keyString(k), err)
			}
		}
	}
	return nil
}

// clearOutbox deletes every entry of b.
func clearOutbox(b *bolt.Bucket) error {
	c := b.Cursor()
	for key, _ := c.First(); key != nil; key, _ = c.Next() {
		if len(key) == 8 {
			if err := c.Delete(); err != nil {
				return err
			}
		}
	}
	return nil
}

// Outbox returns up to max of k's oldest outbox entries, as of the last
// checkpoint (what a crash keeps).
func (s *Store) Outbox(k Key, max int) ([]OutboxEntry, error) {
	var out []OutboxEntry
	err := s.db.View(func(tx *bolt.Tx) error {
		b, _ := changelogTable(tx, k, false)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for key, v := c.First(); key != nil && len(out) < max; key, v = c.Next() {
			if len(key) != 8 {
				continue
			}
			var err error
			if out, err = decodeEntries(out, binary.BigEndian.Uint64(key), v); err != nil {
				return fmt.Errorf("changelog outbox of %s, entry %d: %w: %v", keyString(k), binary.BigEndian.Uint64(key), ErrDamaged, err)
			}
		}
		if len(out) > max {
			out = out[:max] // the rest of a run's record: acknowledged apart
		}
		return nil
	})
	if err != nil {
		return nil, s.fileErr("read outbox", err)
	}
	return out, nil
}

// OutboxOldest returns the source offset of k's oldest outbox entry as of
// the last checkpoint; ok is false when the outbox is empty: every logged
// change the file holds is acknowledged.
func (s *Store) OutboxOldest(k Key) (offset int64, ok bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		b, _ := changelogTable(tx, k, false)
		if b == nil {
			return nil
		}
		c := b.Cursor()
		for key, v := c.First(); key != nil; key, v = c.Next() {
			if len(key) == 8 && len(v) >= 9 {
				offset, ok = int64(binary.BigEndian.Uint64(v[1:9])), true
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return 0, false, s.fileErr("read outbox", err)
	}
	return offset, ok, nil
}

// AckOutbox removes k's outbox entries up to sequence through (the
// changelog acknowledged them) and records pos, in one fsync-ed
// transaction.
func (s *Store) AckOutbox(k Key, through uint64, pos ChangelogPosition) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := changelogTable(tx, k, true)
		if err != nil {
			return err
		}
		c := b.Cursor()
		var split []byte // a record acknowledged in part
		var splitAt uint64
		for key, v := c.First(); key != nil; key, v = c.Next() {
			if len(key) != 8 {
				continue
			}
			seq := binary.BigEndian.Uint64(key)
			if seq > through {
				break
			}
			n, err := recordEntries(v)
			if err != nil {
				return fmt.Errorf("entry %d: %w: %v", seq, ErrDamaged, err)
			}
			if seq+n-1 > through {
				split, splitAt = slices.Clone(v), seq
			}
			if err := c.Delete(); err != nil {
				return err
			}
			if split != nil {
				break
			}
		}
		if split != nil {
			// The record's entries past through stay, under through+1.
			es, err := decodeEntries(nil, splitAt, split)
			if err != nil {
				return fmt.Errorf("entry %d: %w: %v", splitAt, ErrDamaged, err)
			}
			es = es[through-splitAt+1:]
			if err := b.Put(binary.BigEndian.AppendUint64(nil, through+1), appendRun(nil, es[0].Offset, entryChanges(es))); err != nil {
				return err
			}
		}
		return b.Put(positionKey, appendPosition(nil, pos))
	})
	if err != nil {
		return s.fileErr("acknowledge outbox", fmt.Errorf("%s: %w", keyString(k), err))
	}
	return nil
}

// SetChangelogPosition records pos for k, in one fsync-ed transaction.
func (s *Store) SetChangelogPosition(k Key, pos ChangelogPosition) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b, err := changelogTable(tx, k, true)
		if err != nil {
			return err
		}
		return b.Put(positionKey, appendPosition(nil, pos))
	})
	if err != nil {
		return s.fileErr("set changelog position", fmt.Errorf("%s: %w", keyString(k), err))
	}
	return nil
}

// ChangelogPosition returns k's recorded position, NoChangelogPosition
// when it has none.
func (s *Store) ChangelogPosition(k Key) (ChangelogPosition, error) {
	pos := NoChangelogPosition()
	err := s.db.View(func(tx *bolt.Tx) error {
		b, _ := changelogTable(tx, k, false)
		if b == nil {
			return nil
		}
		v := b.Get(positionKey)
		if v == nil {
			return nil
		}
		p, err := decodePosition(v)
		if err != nil {
			return fmt.Errorf("changelog position of %s: %w: %v", keyString(k), ErrDamaged, err)
		}
		pos = p
		return nil
	})
	if err != nil {
		return NoChangelogPosition(), s.fileErr("read changelog position", err)
	}
	return pos, nil
}

// outboxEntries checks the partitions' changelog outboxes and positions
// (Check): a bucket per partition holding entries, the position and the
// next sequence number, each decodable.
func (c *checker) outboxEntries(root *bolt.Bucket) {
	c.nested(root, "changelog", func(g []byte, gb *bolt.Bucket) {
		c.nested(gb, fmt.Sprintf("changelog of group %q", truncName(g)), func(t []byte, tb *bolt.Bucket) {
			where := fmt.Sprintf("changelog of group %q topic %q", truncName(g), truncName(t))
			c.nested(tb, where, func(p []byte, pb *bolt.Bucket) {
				part, err := decodePartitionKey(p)
				if err != nil {
					c.add(SeverityError, nil, "%s: %v", where, err)
					return
				}
				k := Key{Group: string(g), Topic: string(t), Partition: part}
				_ = pb.ForEach(func(key, v []byte) error {
					var err error
					switch {
					case v == nil:
						err = errors.New("a bucket where a value belongs")
					case len(key) == 8:
						_, err = decodeEntries(nil, binary.BigEndian.Uint64(key), v)
					case string(key) == string(positionKey):
						_, err = decodePosition(v)
					case string(key) == string(nextSeqKey):
						if len(v) != 8 {
							err = fmt.Errorf("a next sequence number of %d bytes", len(v))
						}
					default:
						c.add(SeverityWarning, &k, "changelog outbox: unknown key %q", truncName(key))
					}
					if err != nil {
						c.add(SeverityError, &k, "changelog outbox key %q: %v", truncName(key), err)
					}
					return nil
				})
			})
		})
	})
}
