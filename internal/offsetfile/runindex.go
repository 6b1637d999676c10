package offsetfile

import (
	"bytes"
	"sync/atomic"
)

// runIndex finds a key's newest change among a partition's queued runs in
// one probe: runs are queued for about two checkpoints (70 of them at 2M
// messages/s over 8 partitions), and asking each in turn was a tenth of a
// TxHandler's CPU, all of it for a key no queued run changed.
//
// It maps each key to the newest run indexed that changed it. Runs are
// indexed in the order they were committed, at BeginState (update), by the
// goroutine of the one run that holds it (busy): a partition's runs follow
// one another, so the index is never read and written at once. A run
// begun while another holds it asks the queued runs one by one instead.
// An entry of a run written since (older than the oldest queued) is
// stale: the file holds that change, or a newer one. The index is built
// anew when stale entries outnumber the live ones.
type runIndex struct {
	busy  atomic.Bool
	slots []indexSlot // a power of two long, at most half full
	count int         // slots used
	hi    uint64      // the newest run indexed (stateRun.seq)
}

// indexSlot is a key's newest change: entry of run (nil: a free slot).
type indexSlot struct {
	run   *stateRun
	hash  uint64
	entry int32
}

// acquire takes x for a run; false when another run holds it.
func (x *runIndex) acquire() bool { return x.busy.CompareAndSwap(false, true) }

func (x *runIndex) release() { x.busy.Store(false) }

// update indexes the queued runs (oldest first) committed since the last
// update, after starting afresh when most of what it holds is stale.
func (x *runIndex) update(queued stateRuns) {
	live := 0
	for _, r := range queued {
		live += len(r.changes.entries)
	}
	if x.count > 2*live+256 {
		x.slots, x.count, x.hi = nil, 0, 0
	}
	for _, r := range queued {
		if r.seq > x.hi {
			x.add(r)
			x.hi = r.seq
		}
	}
}

// add makes run the newest change of each key it changed.
func (x *runIndex) add(run *stateRun) {
	c := &run.changes
	for e := range c.entries {
		if 2*(x.count+1) > len(x.slots) {
			x.grow()
		}
		en := &c.entries[e]
		i := x.slot(c.data[en.key:en.key+en.keyLen], en.hash)
		if x.slots[i].run == nil {
			x.count++
		}
		x.slots[i] = indexSlot{run: run, hash: en.hash, entry: int32(e)}
	}
}

// find returns the newest indexed change of key, whose hash is h.
func (x *runIndex) find(key []byte, h uint64) (run *stateRun, value []byte, ok bool) {
	if x.count == 0 {
		return nil, nil, false
	}
	s := &x.slots[x.slot(key, h)]
	if s.run == nil {
		return nil, nil, false
	}
	return s.run, s.run.changes.change(int(s.entry)).value, true
}

// slot returns the slot of key: the one holding it, or the free one it
// would take.
func (x *runIndex) slot(key []byte, h uint64) int {
	mask := uint64(len(x.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.run == nil {
			return int(i)
		}
		if s.hash == h {
			c := &s.run.changes
			en := &c.entries[s.entry]
			if bytes.Equal(c.data[en.key:en.key+en.keyLen], key) {
				return int(i)
			}
		}
	}
}

// grow doubles the slots (64 at first) and places every entry again.
func (x *runIndex) grow() {
	old := x.slots
	x.slots = make([]indexSlot, max(64, 2*len(old)))
	mask := uint64(len(x.slots) - 1)
	for _, s := range old {
		if s.run == nil {
			continue
		}
		i := s.hash & mask
		for x.slots[i].run != nil {
			i = (i + 1) & mask
		}
		x.slots[i] = s
	}
}
