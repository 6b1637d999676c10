package framework

import (
	"sync/atomic"
	"time"
)

// LatencyBounds are the upper bounds of the buckets of every latency
// Histogram in Stats, from 50 µs to 60 s: Handler calls that are
// in-memory work land in the first buckets, calls over the network in the
// middle, stuck ones in the last.
var LatencyBounds = []time.Duration{
	50 * time.Microsecond, 100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second,
	10 * time.Second, 30 * time.Second, 60 * time.Second,
}

// Histogram is a latency distribution since Run started, with the buckets
// of LatencyBounds: Counts[i] observations took at most Bounds[i] and more
// than Bounds[i-1]; the last count, Counts[len(Bounds)], took longer than
// the last bound. Count is their total and Sum their total duration.
type Histogram struct {
	Bounds []time.Duration `json:"bounds_ns"`
	Counts []uint64        `json:"counts"`
	Count  uint64          `json:"count"`
	Sum    time.Duration   `json:"sum_ns"`
}

// latency records a Histogram; any goroutine may observe and snapshot it.
type latency struct {
	counts [20]atomic.Uint64 // len(LatencyBounds)+1
	sum    atomic.Int64
}

func (h *latency) observe(d time.Duration) { h.observeN(d, 1) }

// observeN counts d n times: one observation standing for n (sampling).
func (h *latency) observeN(d time.Duration, n uint64) {
	i := 0
	for i < len(LatencyBounds) && d > LatencyBounds[i] {
		i++
	}
	h.counts[i].Add(n)
	h.sum.Add(int64(d) * int64(n))
}

// add adds o's counts to h's (h not shared yet).
func (h *latency) add(o *latency) {
	for i := range h.counts {
		h.counts[i].Add(o.counts[i].Load())
	}
	h.sum.Add(o.sum.Load())
}

func (h *latency) snapshot() Histogram {
	s := Histogram{Bounds: LatencyBounds, Counts: make([]uint64, len(LatencyBounds)+1)}
	for i := range s.Counts {
		s.Counts[i] = h.counts[i].Load()
		s.Count += s.Counts[i]
	}
	s.Sum = time.Duration(h.sum.Load())
	return s
}
