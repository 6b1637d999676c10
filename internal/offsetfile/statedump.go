package offsetfile

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// Reading a file's states whole, for tools: their sizes (tidemark
// inspect), and every entry with the changelog side (tidemark export);
// and writing a partition's state whole with its record (tidemark import).
// A consumer never calls these.

// StateSize is how much of a partition's state the file holds.
type StateSize struct {
	Key
	// Keys counts the state's entries; Bytes adds up their keys' and
	// values' lengths (as Put was given them).
	Keys, Bytes int64
	// Changelog is the partition's changelog position, nil when none is
	// recorded. Outbox counts the changes not yet acknowledged by the
	// changelog: -1 when the partition has no changelog side at all.
	Changelog *ChangelogPosition
	Outbox    int64
}

// StateSizes returns the size of every partition's state, and its
// changelog side, sorted by key: every partition with a state table or a
// changelog outbox, empty ones too. It reads the state tables' pages
// (bbolt's Bucket.Stats) and an outbox's first key, not their values: its cost grows with the number of pages
// and keys, well below a read of every value.
func (s *Store) StateSizes() ([]StateSize, error) {
	var out []StateSize
	err := s.db.View(func(tx *bolt.Tx) error {
		at := map[Key]int{}
		get := func(k Key) *StateSize {
			i, ok := at[k]
			if !ok {
				i = len(out)
				at[k] = i
				out = append(out, StateSize{Key: k, Outbox: -1})
			}
			return &out[i]
		}
		if root := tx.Bucket(stateBucket); root != nil {
			if err := forEachPartition(root, func(k Key, b *bolt.Bucket) error {
				sz := get(k)
				sz.Keys, sz.Bytes = tableSize(b)
				return nil
			}); err != nil {
				return err
			}
		}
		if root := tx.Bucket(changelogBucket); root != nil {
			return forEachPartition(root, func(k Key, b *bolt.Bucket) error {
				sz := get(k)
				sz.Outbox = 0
				// Entries are numbered on without a gap from the oldest
				// record's key up to the next number.
				if next := b.Get(nextSeqKey); len(next) == 8 {
					c := b.Cursor()
					for key, _ := c.First(); key != nil; key, _ = c.Next() {
						if len(key) == 8 {
							sz.Outbox = int64(binary.BigEndian.Uint64(next) - binary.BigEndian.Uint64(key))
							break
						}
					}
				}
				if v := b.Get(positionKey); v != nil {
					p, err := decodePosition(v)
					if err != nil {
						return fmt.Errorf("changelog position of %s: %w: %v", keyString(k), ErrDamaged, err)
					}
					sz.Changelog = &p
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return nil, s.fileErr("read state sizes", err)
	}
	slices.SortFunc(out, func(a, b StateSize) int { return compareKeys(a.Key, b.Key) })
	return out, nil
}

// tableSize counts b's keys and their keys' and values' bytes, without the
// values' format byte, from bbolt's page statistics: a leaf page uses a
// 16-byte header, then a 16-byte element per key, then the keys and values
// (the layout pages.go reads). b holds no buckets.
func tableSize(b *bolt.Bucket) (keys, size int64) {
	st := b.Stats()
	keys = int64(st.KeyN)
	pages := int64(st.LeafPageN + st.InlineBucketN)
	size = int64(st.LeafInuse+st.InlineBucketInuse) - pages*pageHeaderSize - keys*pageElemSize - keys
	return keys, max(size, 0)
}

// forEachPartition calls fn for every partition's bucket under root (the
// state or changelog bucket: GROUP/TOPIC/PARTITION), in key order. What
// is not a bucket where one belongs is skipped: Check reports it.
func forEachPartition(root *bolt.Bucket, fn func(Key, *bolt.Bucket) error) error {
	return root.ForEachBucket(func(g []byte) error {
		gb := root.Bucket(g)
		return gb.ForEachBucket(func(t []byte) error {
			tb := gb.Bucket(t)
			return tb.ForEachBucket(func(p []byte) error {
				part, err := decodePartitionKey(p)
				if err != nil {
					return nil
				}
				return fn(Key{Group: string(g), Topic: string(t), Partition: part}, tb.Bucket(p))
			})
		})
	})
}

// StateEntry is one key of a partition's state and its value.
type StateEntry struct {
	Key, Value []byte
}

// StateDump is everything the file holds of one partition's state.
type StateDump struct {
	// Entries are the state's keys and values, in key order.
	Entries []StateEntry
	// Changelog is the partition's changelog position; nil when none is
	// recorded.
	Changelog *ChangelogPosition
	// Outbox are the changes the changelog has not acknowledged, oldest
	// first.
	Outbox []OutboxEntry
	// spoilt marks a salvaged state that was not read whole (Salvage).
	spoilt bool
}

// Empty reports whether d holds nothing.
func (d *StateDump) Empty() bool {
	return d == nil || (len(d.Entries) == 0 && d.Changelog == nil && len(d.Outbox) == 0)
}

// DumpStates returns every partition's state, with its changelog
// position and outbox, as of the last checkpoint: every partition with a
// state table or a changelog side, empty ones left out. It reads every
// value: for a large state, the export it is for is as large.
func (s *Store) DumpStates() (map[Key]*StateDump, error) {
	out := map[Key]*StateDump{}
	get := func(k Key) *StateDump {
		d := out[k]
		if d == nil {
			d = &StateDump{}
			out[k] = d
		}
		return d
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		if root := tx.Bucket(stateBucket); root != nil {
			if err := forEachPartition(root, func(k Key, b *bolt.Bucket) error {
				return b.ForEach(func(key, v []byte) error {
					if v == nil || len(v) == 0 || v[0] != stateValueV1 {
						return fmt.Errorf("state of %s, key %q: %w: a value of an unknown format", keyString(k), truncName(key), ErrDamaged)
					}
					d := get(k)
					d.Entries = append(d.Entries, StateEntry{Key: slices.Clone(key), Value: append([]byte{}, v[1:]...)})
					return nil
				})
			}); err != nil {
				return err
			}
		}
		if root := tx.Bucket(changelogBucket); root != nil {
			return forEachPartition(root, func(k Key, b *bolt.Bucket) error {
				return b.ForEach(func(key, v []byte) error {
					switch {
					case v == nil:
					case len(key) == 8:
						seq := binary.BigEndian.Uint64(key)
						d := get(k)
						var err error
						if d.Outbox, err = decodeEntries(d.Outbox, seq, v); err != nil {
							return fmt.Errorf("changelog outbox of %s, entry %d: %w: %v", keyString(k), seq, ErrDamaged, err)
						}
					case bytes.Equal(key, positionKey):
						p, err := decodePosition(v)
						if err != nil {
							return fmt.Errorf("changelog position of %s: %w: %v", keyString(k), ErrDamaged, err)
						}
						get(k).Changelog = &p
					}
					return nil
				})
			})
		}
		return nil
	})
	if err != nil {
		return nil, s.fileErr("read states", err)
	}
	return out, nil
}

// stateImport is a partition's state that PutState queued, for the next
// checkpoint.
type stateImport struct {
	key  Key
	dump StateDump
}

// PutState queues r as k's whole record, as Put does, and d as k's whole
// state: d's entries replace the partition's state, its changelog
// position and outbox replace the partition's (none are left when d has
// none; a nil d empties it all). The record and the state are written in
// the same checkpoint, one transaction: a crash leaves both or neither.
// It is for tools that move a file (tidemark import), on a store no
// consumer uses: runs of k begun before it cannot commit (FenceState), and
// BeginState reads the state PutState wrote only once it is flushed.
func (s *Store) PutState(k Key, r Record, d *StateDump) error {
	const op = "put state"
	if err := validateKey(k); err != nil {
		return s.fileErr(op, err)
	}
	var dump StateDump
	if d != nil {
		var err error
		if dump, err = normStateDump(*d); err != nil {
			return s.fileErr(op, fmt.Errorf("%s: %w", keyString(k), err))
		}
	}
	if err := validateRecord(&r); err != nil {
		return s.fileErr(op, fmt.Errorf("%s: %w", keyString(k), err))
	}
	p := putPatch(r)
	return s.enqueueWith(op, k, p, func() error {
		// Under s.mu, with the record: the writer takes both in the same
		// flush, and checkpoints it.
		if s.stateEpoch == nil {
			s.stateEpoch = map[Key]uint64{}
		}
		s.stateEpoch[k]++
		delete(s.stateIndex, k)
		s.pendingImports = append(s.pendingImports, stateImport{key: k, dump: dump})
		return nil
	})
}

// normStateDump checks d as PutState takes it, and returns a copy with its
// entries in key order and its outbox in sequence order.
func normStateDump(d StateDump) (StateDump, error) {
	out := StateDump{Entries: slices.Clone(d.Entries), Outbox: slices.Clone(d.Outbox)}
	slices.SortFunc(out.Entries, func(a, b StateEntry) int { return bytes.Compare(a.Key, b.Key) })
	for i, e := range out.Entries {
		if err := stateKeyErr(e.Key); err != nil {
			return StateDump{}, fmt.Errorf("state: %w", err)
		}
		if len(e.Value) > MaxStateValue {
			return StateDump{}, fmt.Errorf("state key %q: value of %d bytes, over the limit of %d (MaxStateValue)", truncName(e.Key), len(e.Value), MaxStateValue)
		}
		if i > 0 && bytes.Equal(out.Entries[i-1].Key, e.Key) {
			return StateDump{}, fmt.Errorf("state key %q is listed twice", truncName(e.Key))
		}
	}
	slices.SortFunc(out.Outbox, func(a, b OutboxEntry) int { return cmp.Compare(a.Seq, b.Seq) })
	for i, e := range out.Outbox {
		if i > 0 && out.Outbox[i-1].Seq == e.Seq {
			return StateDump{}, fmt.Errorf("changelog outbox entry %d is listed twice", e.Seq)
		}
		if e.Seq == 1<<64-1 {
			return StateDump{}, fmt.Errorf("changelog outbox entry %d: the last sequence number is never used", e.Seq)
		}
		if e.Offset < 0 {
			return StateDump{}, fmt.Errorf("changelog outbox entry %d: source offset %d: must be >= 0", e.Seq, e.Offset)
		}
		if err := stateKeyErr(e.Key); err != nil {
			return StateDump{}, fmt.Errorf("changelog outbox entry %d: %w", e.Seq, err)
		}
		switch {
		case e.Delete && len(e.Value) > 0:
			return StateDump{}, fmt.Errorf("changelog outbox entry %d: a deletion with a value", e.Seq)
		case len(e.Value) > MaxStateValue:
			return StateDump{}, fmt.Errorf("changelog outbox entry %d: value of %d bytes, over the limit of %d (MaxStateValue)", e.Seq, len(e.Value), MaxStateValue)
		}
	}
	if p := d.Changelog; p != nil {
		if err := validatePosition(p); err != nil {
			return StateDump{}, fmt.Errorf("changelog position: %w", err)
		}
		c := *p
		c.Markers = slices.Clone(p.Markers)
		out.Changelog = &c
	}
	return out, nil
}

// stateKeyErr checks a key as StateTx.Put does; its error names the key,
// cut short (normStateDump sorts the entries: an index would not say which
// one the caller gave).
func stateKeyErr(key []byte) error {
	switch {
	case len(key) == 0:
		return errors.New("empty key")
	case len(key) > MaxStateKey:
		return fmt.Errorf("key %q: %d bytes, over the limit of %d (MaxStateKey)", truncName(key), len(key), MaxStateKey)
	}
	return nil
}

// validatePosition checks what the framework could have recorded: offsets
// of -1 (none) or more, Next 0 or more, markers in changelog order below
// Next.
func validatePosition(p *ChangelogPosition) error {
	switch {
	case p.Epoch < -1 || p.Start < -1 || p.Acked < -1:
		return fmt.Errorf("epoch %d, start %d, acked %d: each must be >= -1", p.Epoch, p.Start, p.Acked)
	case p.Next < 0:
		return fmt.Errorf("next %d: must be >= 0", p.Next)
	}
	for i, m := range p.Markers {
		switch {
		case m.Epoch < 0 || m.Start < -1:
			return fmt.Errorf("marker %d: epoch %d, start %d: want epoch >= 0, start >= -1", i, m.Epoch, m.Start)
		case i > 0 && m.Epoch <= p.Markers[i-1].Epoch:
			return fmt.Errorf("marker %d: epoch %d not above the one before (%d)", i, m.Epoch, p.Markers[i-1].Epoch)
		}
	}
	return nil
}

// writeImports replaces each imported partition's state and changelog
// side in tx: after the runs' changes (writeState), which it replaces.
func writeImports(tx *bolt.Tx, imports []stateImport) error {
	for _, im := range imports {
		k, d := im.key, im.dump
		pk := partitionKey(k.Partition)
		for _, root := range [][]byte{stateBucket, changelogBucket} {
			if err := deletePartitionBucket(tx, root, k); err != nil {
				return fmt.Errorf("replacing the %s of %s: %w", root, keyString(k), err)
			}
		}
		if len(d.Entries) > 0 {
			b, err := createPath(tx, stateBucket, []byte(k.Group), []byte(k.Topic), pk[:])
			if err != nil {
				return fmt.Errorf("state of %s: %w", keyString(k), err)
			}
			for _, e := range d.Entries {
				v := make([]byte, 1+len(e.Value))
				v[0] = stateValueV1
				copy(v[1:], e.Value)
				if err := b.Put(e.Key, v); err != nil {
					return fmt.Errorf("state of %s, key %q: %w", keyString(k), truncName(e.Key), err)
				}
			}
		}
		if d.Changelog == nil && len(d.Outbox) == 0 {
			continue
		}
		b, err := changelogTable(tx, k, true)
		if err != nil {
			return err
		}
		if d.Changelog != nil {
			if err := b.Put(positionKey, appendPosition(nil, *d.Changelog)); err != nil {
				return fmt.Errorf("changelog position of %s: %w", keyString(k), err)
			}
		}
		for i, e := range d.Outbox {
			if err := b.Put(binary.BigEndian.AppendUint64(nil, e.Seq), appendRun(nil, e.Offset, entryChanges(d.Outbox[i:i+1]))); err != nil {
				return fmt.Errorf("changelog outbox of %s: %w", keyString(k), err)
			}
		}
		if n := len(d.Outbox); n > 0 {
			next := binary.BigEndian.AppendUint64(nil, d.Outbox[n-1].Seq+1)
			if err := b.Put(nextSeqKey, next); err != nil {
				return fmt.Errorf("changelog outbox of %s: %w", keyString(k), err)
			}
		}
	}
	return nil
}

// deletePartitionBucket deletes k's bucket under root (the state or
// changelog bucket), if there is one.
func deletePartitionBucket(tx *bolt.Tx, root []byte, k Key) error {
	b := topicTable(tx, root, k)
	if b == nil {
		return nil
	}
	pk := partitionKey(k.Partition)
	if b.Bucket(pk[:]) == nil {
		return nil
	}
	return b.DeleteBucket(pk[:])
}

// createPath returns the bucket at names, creating what is missing.
func createPath(tx *bolt.Tx, names ...[]byte) (*bolt.Bucket, error) {
	b, err := tx.CreateBucketIfNotExists(names[0])
	for _, n := range names[1:] {
		if err != nil {
			break
		}
		b, err = b.CreateBucketIfNotExists(n)
	}
	return b, err
}
