package offsetfile

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"math"
	"slices"
)

// changeSet is one run's changes to a partition's state: each key's newest
// value or deletion. Keys and values are copied into one byte slice and
// found through an open-addressing index by the key's hash, so that a
// run's changes cost a few allocations without pointers, whatever their
// number: a Go map of strings to values, made for every run, hashed again
// at its commit and copied at every checkpoint, was most of a TxHandler's
// cost. The zero changeSet is empty and ready to use. A run's changeSet is
// written by the run's goroutine only, and never changed after its commit.
type changeSet struct {
	data    []byte // keys and values (each after its format byte)
	entries []changeEntry
	// index holds entry+1 at the slot of its key's hash (linear probing,
	// at most half full), 0 at a free slot; its length is a power of two.
	index []int32
}

// changeEntry locates one key's change in data. A deletion has no value.
type changeEntry struct {
	hash     uint64
	key      uint32 // offset of the key in data
	keyLen   uint32
	value    uint32 // offset of the value, format byte first
	valueLen uint32 // with the format byte; 0 for a deletion
}

// change is a key's new value, with its format byte, or nil for its
// deletion.
type change struct {
	key, value []byte
}

var keySeed = maphash.MakeSeed()

func keyHash(key []byte) uint64 { return maphash.Bytes(keySeed, key) }

// slot returns the index slot of key: the one holding its entry, or the
// free one it would take.
func (c *changeSet) slot(key []byte, h uint64) int {
	mask := uint64(len(c.index) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		e := c.index[i]
		if e == 0 {
			return int(i)
		}
		if en := &c.entries[e-1]; en.hash == h && bytes.Equal(c.data[en.key:en.key+en.keyLen], key) {
			return int(i)
		}
	}
}

// find returns key's change, whose hash is h: its value (nil for a
// deletion) and whether the set holds it.
func (c *changeSet) find(key []byte, h uint64) (value []byte, ok bool) {
	if len(c.entries) == 0 {
		return nil, false
	}
	e := c.index[c.slot(key, h)]
	if e == 0 {
		return nil, false
	}
	return c.change(int(e - 1)).value, true
}

// change returns entry i.
func (c *changeSet) change(i int) change {
	en := &c.entries[i]
	ch := change{key: c.data[en.key : en.key+en.keyLen : en.key+en.keyLen]}
	if en.valueLen > 0 {
		end := en.value + en.valueLen
		ch.value = c.data[en.value:end:end]
	}
	return ch
}

// changes returns the set's changes in the order their keys were first
// changed.
func (c *changeSet) changes() []change {
	out := make([]change, len(c.entries))
	for i := range c.entries {
		out[i] = c.change(i)
	}
	return out
}

// set records key's new value (copied, after the format byte), or its
// deletion when del is set.
func (c *changeSet) set(key []byte, h uint64, value []byte, del bool) error {
	size := len(key)
	if !del {
		size += 1 + len(value)
	}
	if len(c.data)+size > math.MaxUint32 {
		return fmt.Errorf("the run's changes exceed %d bytes: hand it fewer messages", uint32(math.MaxUint32))
	}
	if 2*(len(c.entries)+1) > len(c.index) {
		c.grow()
	}
	i := c.slot(key, h)
	var en *changeEntry
	if e := c.index[i]; e != 0 {
		en = &c.entries[e-1] // a key changed again: its new value is appended
	} else {
		c.entries = append(c.entries, changeEntry{hash: h, key: uint32(len(c.data)), keyLen: uint32(len(key))})
		c.index[i] = int32(len(c.entries))
		c.data = append(c.data, key...)
		en = &c.entries[len(c.entries)-1]
	}
	en.value, en.valueLen = uint32(len(c.data)), 0
	if !del {
		c.data = append(c.data, stateValueV1)
		c.data = append(c.data, value...)
		en.valueLen = uint32(1 + len(value))
	}
	return nil
}

// sizeLike makes room for as many changes as like holds, up to 4,096: a
// run is sized like the one before it, instead of growing from nothing
// each time, but a restore's large runs are not copied in size.
func (c *changeSet) sizeLike(like *changeSet) {
	const most = 4096
	n := len(like.entries)
	if n == 0 {
		return
	}
	c.entries = make([]changeEntry, 0, min(n, most))
	c.data = make([]byte, 0, min(len(like.data), most*64))
	c.index = make([]int32, max(32, min(len(like.index), 2*most)))
}

// reserve makes room for n more changes holding size bytes of keys and
// values: a restore knows its size, and growing to it would copy the data
// again and again.
func (c *changeSet) reserve(n, size int) {
	c.entries = slices.Grow(c.entries, n)
	c.data = slices.Grow(c.data, size)
	want := 32
	for want < 2*(len(c.entries)+n) {
		want *= 2
	}
	if want > len(c.index) {
		c.index = make([]int32, want/2) // grow doubles it and places the entries
		c.grow()
	}
}

// grow doubles the index (32 slots at first) and places every entry again.
func (c *changeSet) grow() {
	c.index = make([]int32, max(32, 2*len(c.index)))
	mask := uint64(len(c.index) - 1)
	for e := range c.entries {
		i := c.entries[e].hash & mask
		for c.index[i] != 0 {
			i = (i + 1) & mask
		}
		c.index[i] = int32(e + 1)
	}
}

// mergeChanges returns the changes of sets, oldest first, in key order:
// of a key changed in several, the newest.
func mergeChanges(sets ...*changeSet) []change {
	n := 0
	for _, c := range sets {
		n += len(c.entries)
	}
	// Sorted as indexes without pointers to move, each with its key's
	// first 8 bytes, which order most pairs without a look at the keys:
	// sorting the changes themselves was most of a checkpoint's CPU.
	// Built in set order, and sorted stably, so that of a key's changes
	// the newest comes last.
	buf := make([]changeRef, 2*n)
	refs := buf[:0:n]
	for si, c := range sets {
		for e := range c.entries {
			en := &c.entries[e]
			var p [8]byte
			copy(p[:], c.data[en.key:en.key+en.keyLen])
			refs = append(refs, changeRef{prefix: binary.BigEndian.Uint64(p[:]), set: int32(si), entry: int32(e)})
		}
	}
	key := func(r changeRef) []byte {
		c := sets[r.set]
		en := &c.entries[r.entry]
		return c.data[en.key : en.key+en.keyLen]
	}
	refs = sortPrefixes(refs, buf[n:])
	// Keys of one prefix (shorter or longer than 8 bytes) in key order.
	for i := 0; i < len(refs); {
		j := i + 1
		for j < len(refs) && refs[j].prefix == refs[i].prefix {
			j++
		}
		if j-i > 1 {
			slices.SortStableFunc(refs[i:j], func(a, b changeRef) int { return bytes.Compare(key(a), key(b)) })
		}
		i = j
	}
	out := make([]change, 0, len(refs))
	for i, r := range refs {
		if i+1 < len(refs) {
			if next := refs[i+1]; next.prefix == r.prefix && bytes.Equal(key(r), key(next)) {
				continue // a newer set changed it again
			}
		}
		out = append(out, sets[r.set].change(int(r.entry)))
	}
	return out
}

// sortPrefixes sorts refs stably by prefix, with tmp (as long) for room,
// and returns the sorted slice: one of the two. A radix sort, a byte at a
// time from the lowest, skipping the bytes all prefixes share (most, for
// keys of a common shape): a comparison sort through a function was 12%
// of a TxHandler's CPU.
func sortPrefixes(refs, tmp []changeRef) []changeRef {
	if len(refs) < 64 {
		slices.SortStableFunc(refs, func(a, b changeRef) int { return cmp.Compare(a.prefix, b.prefix) })
		return refs
	}
	var counts [8][256]int32
	for _, r := range refs {
		for d := range 8 {
			counts[d][byte(r.prefix>>(8*d))]++
		}
	}
	src, dst := refs, tmp[:len(refs)]
	for d := range 8 {
		c := &counts[d]
		shift := 8 * d
		if int(c[byte(src[0].prefix>>shift)]) == len(src) {
			continue // every prefix has this byte
		}
		var sum int32
		for b := range c {
			c[b], sum = sum, sum+c[b]
		}
		for _, r := range src {
			b := byte(r.prefix >> shift)
			dst[c[b]] = r
			c[b]++
		}
		src, dst = dst, src
	}
	return src
}

// changeRef is entry of sets[set], in mergeChanges.
type changeRef struct {
	prefix     uint64 // the key's first 8 bytes, big-endian, zero-padded
	set, entry int32
}
