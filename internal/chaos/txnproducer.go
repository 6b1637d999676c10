package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TxnOutcome is what became of a transaction the transactional producer
// wrote: committed, aborted, or unknown (its commit or abort failed, so
// either may have happened).
type TxnOutcome int8

// Outcomes of a transaction.
const (
	TxnCommitted TxnOutcome = iota + 1
	TxnAborted
	TxnUnknown
)

// txnProducer writes TxnValue(p, seq) to every partition of the topic in
// franz-go transactions, straight to the broker, interleaved with the
// plain producer's records: one transaction per txnTick, one in txnAbortEvery
// aborted on purpose. Sequence numbers are never reused, so every value
// names one record of one transaction, and outcomes records what became of
// it. A transaction whose produce fails is aborted; when its commit or
// abort fails the client is replaced, which fences the old producer id and
// makes the broker abort what it left open.
type txnProducer struct {
	addr, id string
	topic    string
	parts    int
	rate     int
	keys     int

	mu       sync.Mutex
	next     []int64 // per partition: the next sequence number
	outcomes map[string]TxnOutcome
	txns     int
	errors   int
	last     error
}

const (
	txnTick       = 100 * time.Millisecond
	txnAbortEvery = 3
	// txnTimeout bounds how long a transaction left open by a replaced
	// client holds its partitions before the broker aborts it.
	txnTimeout = 10 * time.Second
)

func newTxnProducer(addr, id, topic string, parts, rate, keys int) *txnProducer {
	return &txnProducer{addr: addr, id: id, topic: topic, parts: parts, rate: rate, keys: keys,
		next: make([]int64, parts), outcomes: map[string]TxnOutcome{}}
}

func (p *txnProducer) client() (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(p.addr), kgo.TransactionalID(p.id), kgo.TransactionTimeout(txnTimeout),
		kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ClientID("tidemark-chaos-txn-producer"))
}

// run writes transactions until ctx ends; the one in flight then is
// aborted.
func (p *txnProducer) run(ctx context.Context) {
	kc, err := p.client()
	if err != nil {
		p.fail(fmt.Errorf("starting the transactional producer: %w", err))
		return
	}
	defer func() { kc.Close() }()
	t := time.NewTicker(txnTick)
	defer t.Stop()
	start := time.Now()
	var sent int64
	part := 0
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		due := min(int64(time.Since(start).Seconds()*float64(p.rate))-sent, int64(p.rate))
		if due <= 0 {
			continue
		}
		sent += due
		recs := make([]*kgo.Record, due)
		p.mu.Lock()
		for i := range recs {
			seq := p.next[part]
			p.next[part]++
			recs[i] = &kgo.Record{Topic: p.topic, Partition: int32(part), Value: TxnValue(part, seq)}
			if p.keys > 0 {
				recs[i].Key = KeyOf(seq, p.keys)
			}
			part = (part + 1) % p.parts
		}
		p.mu.Unlock()
		outcome, err := p.transaction(ctx, kc, recs, n%txnAbortEvery != txnAbortEvery-1)
		p.record(recs, outcome, err)
		if err != nil {
			kc.Close()
			if kc, err = p.client(); err != nil {
				p.fail(fmt.Errorf("restarting the transactional producer: %w", err))
				return
			}
			if !sleepCtx(ctx, 200*time.Millisecond) {
				return
			}
		}
	}
}

// transaction writes recs in one transaction and ends it; the outcome is
// unknown when the end failed, or when the run ended while it was open
// and its abort failed.
func (p *txnProducer) transaction(ctx context.Context, kc *kgo.Client, recs []*kgo.Record, commit bool) (TxnOutcome, error) {
	if err := kc.BeginTransaction(); err != nil {
		return TxnAborted, fmt.Errorf("beginning a transaction: %w", err) // nothing produced yet
	}
	// The end has its own time: the run ending must not leave the
	// transaction open (it would hold the partitions until txnTimeout).
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer cancel()
	pctx, pcancel := context.WithTimeout(ctx, 15*time.Second)
	defer pcancel()
	if err := kc.ProduceSync(pctx, recs...).FirstErr(); err != nil {
		if aerr := kc.EndTransaction(endCtx, kgo.TryAbort); aerr != nil {
			return TxnUnknown, fmt.Errorf("producing in a transaction: %w; aborting it: %v", err, aerr)
		}
		return TxnAborted, fmt.Errorf("producing in a transaction (aborted): %w", err)
	}
	end, outcome := kgo.TryAbort, TxnAborted
	if commit {
		end, outcome = kgo.TryCommit, TxnCommitted
	}
	if err := kc.EndTransaction(endCtx, end); err != nil {
		return TxnUnknown, fmt.Errorf("ending a transaction (commit %v): %w", commit, err)
	}
	return outcome, nil
}

func (p *txnProducer) record(recs []*kgo.Record, outcome TxnOutcome, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.txns++
	for _, r := range recs {
		p.outcomes[string(r.Value)] = outcome
	}
	if err != nil {
		p.errors++
		p.last = err
	}
}

func (p *txnProducer) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errors++
	p.last = err
}

// snapshot returns every value's outcome, the transactions ended, the
// failed ones and the last failure.
func (p *txnProducer) snapshot() (outcomes map[string]TxnOutcome, txns, errors int, last error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]TxnOutcome, len(p.outcomes))
	for k, v := range p.outcomes {
		out[k] = v
	}
	return out, p.txns, p.errors, p.last
}

// TxnValue is the payload the transactional producer writes: partition
// and sequence number, told apart from Value by its "t".
func TxnValue(partition int, seq int64) []byte { return fmt.Appendf(nil, "p%d-t%09d", partition, seq) }

func parseTxnValue(partition int, v string) (int64, bool) {
	rest, ok := strings.CutPrefix(v, fmt.Sprintf("p%d-t", partition))
	if !ok {
		return 0, false
	}
	seq, err := strconv.ParseInt(rest, 10, 64)
	return seq, err == nil && seq >= 0
}
