package main

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
)

// keyed is the state of the keyed handler, the concurrency section's: its
// calls for one partition may run concurrently (Config.Ordering), so every
// check is an atomic operation.
type keyed struct {
	keys []keyState
	// seen has a bit per offset of each partition, from StartAt: a message
	// handled twice is a repeat.
	seen [][]atomic.Uint64
	// contiguous: OrderPartition, whose calls for a partition are one at a
	// time, also gets the main tables' check (each offset the one after the
	// previous, sink.parts).
	contiguous bool
	pause      time.Duration
	stuck      bool
	violations atomic.Int64

	// Written by watchKeyed, read once the consumer returned.
	inFlightSum, samples    int64
	aheadMin, aheadSum      int64
	waitingSum, inFlightEnd int64
}

// keyState is one key's: the last offset whose call started, and whether
// a call is running. One cache line each: different keys run on different
// goroutines.
type keyState struct {
	last atomic.Int64
	busy atomic.Int32
	_    [52]byte
}

func (k *keyed) init(sp *childSpec) {
	k.keys = make([]keyState, sp.Keys)
	for i := range k.keys {
		k.keys[i].last.Store(sp.StartAt - 1)
	}
	k.seen = make([][]atomic.Uint64, sp.Partitions)
	for p := range k.seen {
		k.seen[p] = make([]atomic.Uint64, (sp.PerPartition+63)/64)
	}
	k.contiguous = sp.Ordering == framework.OrderPartition
	k.pause = handlerLatency(sp.Handler)
	k.stuck = sp.StuckAhead > 0
}

// state returns the state of key, the decimal number of a key that lives
// in partition, or nil if key is not one.
func (k *keyed) state(key []byte, partition, partitions int) *keyState {
	if len(key) == 0 {
		return nil
	}
	n := 0
	for _, c := range key {
		if c < '0' || c > '9' || n >= len(k.keys) {
			return nil
		}
		n = n*10 + int(c-'0')
	}
	if n >= len(k.keys) || n%partitions != partition {
		return nil
	}
	return &k.keys[n]
}

// seeKeyed is the keyed Handler. It counts a per-key violation when a call
// starts while another call of its key runs, or with an offset not above
// the last one started for its key; and as out of order (the run fails) a
// repeated offset, an offset outside the topic, or a key that is not one
// of the partition's. Then it sleeps as the handler mode says (in a stuck
// run the partition's first message first waits for the window to end),
// and counts the message.
func (s *sink) seeKeyed(ctx context.Context, m *kafka.Message) {
	k := &s.keyed
	if m.Partition < 0 || m.Partition >= len(s.parts) {
		s.bad.Add(1)
		return
	}
	if k.contiguous {
		p := &s.parts[m.Partition]
		if m.Offset != p.next {
			p.bad++
		}
		p.next = m.Offset + 1
	}
	if i := m.Offset - s.sp.StartAt; i >= 0 && i < s.sp.PerPartition {
		w, bit := &k.seen[m.Partition][i/64], uint64(1)<<(i%64)
		if w.Or(bit)&bit != 0 {
			s.bad.Add(1)
		}
	} else {
		s.bad.Add(1)
	}
	ks := k.state(m.Key, m.Partition, len(s.parts))
	if ks == nil {
		s.bad.Add(1)
	} else {
		if !ks.busy.CompareAndSwap(0, 1) {
			k.violations.Add(1)
		}
		if prev := ks.last.Swap(m.Offset); prev >= m.Offset {
			k.violations.Add(1)
		}
	}
	if k.stuck && m.Offset == s.sp.StartAt {
		select {
		case <-s.done:
		case <-ctx.Done():
		}
	}
	if k.pause > 0 {
		time.Sleep(k.pause)
	}
	if ks != nil {
		ks.busy.Store(0)
	}
	s.firstOnce.Do(s.begin)
	if s.n.Add(1) == s.sp.Want {
		s.end()
	}
}

func (k *keyed) result(r *childResult) {
	r.KeyViolations = k.violations.Load()
	r.MeanInFlight = -1 // no sample: a window shorter than the period
	if k.samples > 0 {
		r.MeanInFlight = float64(k.inFlightSum) / float64(k.samples)
	}
	r.AheadMin, r.AheadSum = k.aheadMin, k.aheadSum
	r.WaitingSum, r.InFlightSum = k.waitingSum, k.inFlightEnd
}

// watchKeyed runs once the window started: it samples c's Stats every
// 50 ms until the window ends (the messages in calls, for MeanInFlight);
// in a stuck run it also checks, every 10 ms, whether every partition's
// window is full with at least StuckAhead messages completed above its
// stuck message, and then ends the window itself, which releases the
// stuck calls.
func watchKeyed(ctx context.Context, c *framework.Consumer, sp *childSpec, s *sink) {
	const sampleEvery = 50 * time.Millisecond
	tick := sampleEvery
	if sp.StuckAhead > 0 {
		tick = 10 * time.Millisecond
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	k := &s.keyed
	var sampled time.Time
	for {
		var now time.Time
		select {
		case <-ctx.Done():
			return
		case <-s.done:
			return
		case now = <-t.C:
		}
		st := c.Stats()
		var inFlight, waiting, ahead int64
		aheadMin, full := int64(-1), 0
		for _, p := range st.Partitions {
			inFlight += int64(p.InFlight)
			waiting += int64(p.Waiting)
			a := int64(p.CompletedAhead)
			ahead += a
			if aheadMin < 0 || a < aheadMin {
				aheadMin = a
			}
			if p.WindowFull && p.CompletedAhead >= sp.StuckAhead {
				full++
			}
		}
		if now.Sub(sampled) >= sampleEvery-tick/2 {
			k.inFlightSum += inFlight
			k.samples++
			sampled = now
		}
		if sp.StuckAhead > 0 && len(st.Partitions) == sp.Partitions && full == sp.Partitions {
			k.aheadMin, k.aheadSum, k.waitingSum, k.inFlightEnd = aheadMin, ahead, waiting, inFlight
			s.end()
			return
		}
	}
}
