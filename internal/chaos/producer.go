package chaos

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// producer writes Value(p, seq) to every partition of the topic at a steady
// total rate, round robin, straight to the broker (never through a fault
// proxy). A failed write is retried with the same sequence numbers until it
// succeeds, so a partition's acknowledged sequence numbers are always
// 0..n-1; a write that landed although its answer was lost appears twice
// in the log.
type producer struct {
	tr    *kafka.Transport
	cl    *kafka.Client
	topic string
	parts int
	rate  int
	keys  int // keys per partition (KeyOf); 0: no keys

	mu     sync.Mutex
	acked  []int64 // per partition: next sequence number = acknowledged count
	errors int
	last   error
}

func newProducer(addr, topic string, parts, rate, keys int) *producer {
	tr := &kafka.Transport{ClientID: "tidemark-chaos-producer", DialTimeout: 5 * time.Second, MetadataTTL: time.Second}
	return &producer{
		tr:    tr,
		cl:    &kafka.Client{Addr: kafka.TCP(addr), Transport: tr, Timeout: 10 * time.Second},
		topic: topic,
		parts: parts,
		rate:  rate,
		keys:  keys,
		acked: make([]int64, parts),
	}
}

// tick is how often the producer writes what is due.
const tick = 20 * time.Millisecond

// run produces until ctx ends. Behind schedule (a broker restart), it
// catches up by at most one second's worth of messages.
func (p *producer) run(ctx context.Context) {
	defer p.tr.CloseIdleConnections()
	t := time.NewTicker(tick)
	defer t.Stop()
	start := time.Now()
	var sent int64
	next := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		due := int64(time.Since(start).Seconds()*float64(p.rate)) - sent
		if due > int64(p.rate) {
			sent += due - int64(p.rate)
			due = int64(p.rate)
		}
		if due <= 0 {
			continue
		}
		counts := make([]int, p.parts)
		for i := int64(0); i < due; i++ {
			counts[next]++
			next = (next + 1) % p.parts
		}
		for part, n := range counts {
			if n > 0 && !p.produce(ctx, part, n) {
				return
			}
		}
		sent += due
	}
}

// produce writes the next n sequence numbers of partition part, retrying
// until they are acknowledged (true) or ctx ends (false).
func (p *producer) produce(ctx context.Context, part, n int) bool {
	p.mu.Lock()
	first := p.acked[part]
	p.mu.Unlock()
	backoff := 50 * time.Millisecond
	for {
		recs := make([]kafka.Record, n)
		for i := range recs {
			recs[i] = kafka.Record{Value: kafka.NewBytes(Value(part, first+int64(i)))}
			if p.keys > 0 {
				recs[i].Key = kafka.NewBytes(KeyOf(first+int64(i), p.keys))
			}
		}
		res, err := p.cl.Produce(ctx, &kafka.ProduceRequest{
			Topic: p.topic, Partition: part, RequiredAcks: kafka.RequireAll, Records: kafka.NewRecordReader(recs...),
		})
		if err == nil {
			err = res.Error
		}
		if err == nil && len(res.RecordErrors) > 0 {
			err = fmt.Errorf("record errors: %v", res.RecordErrors)
		}
		if err == nil {
			p.mu.Lock()
			p.acked[part] = first + int64(n)
			p.mu.Unlock()
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		p.mu.Lock()
		p.errors++
		p.last = fmt.Errorf("producing sequence numbers %d..%d to %s/%d: %w", first, first+int64(n)-1, p.topic, part, err)
		p.mu.Unlock()
		if !sleepCtx(ctx, backoff) {
			return false
		}
		backoff = min(2*backoff, time.Second)
	}
}

// snapshot returns the acknowledged counts, the number of failed writes
// and the last failure.
func (p *producer) snapshot() (acked []int64, errors int, last error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int64(nil), p.acked...), p.errors, p.last
}
