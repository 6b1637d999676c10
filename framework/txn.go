package framework

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Transactions, at Config.IsolationLevel kafka.ReadCommitted.
//
// A transactional producer writes its records in batches flagged
// transactional, then one control batch (a marker) that commits or aborts
// them. The records stay in the log either way, so a read_committed
// consumer drops the aborted ones itself. A Fetch at isolation level 1
// returns, per partition, records below the last stable offset (LSO) only,
// and the aborted transactions overlapping what it returned, each as a
// producer id and the transaction's first offset. Reading the batches in
// offset order, a transactional batch of producer P is dropped when one of
// P's aborted transactions started at or before it and P's abort marker has
// not been read since. This is the algorithm of Kafka's Java consumer and
// of franz-go. Each fetch reports every aborted transaction that overlaps
// it, including those that began before its offset, so the state lives for
// one chunk (one partition's part of one response), never across them.
//
// Control batches are never handed out, at either isolation level, and
// always move the watermark: a partition whose log ends in a marker is
// committed at the log end.

// abortedTxn is an aborted transaction a Fetch response reported.
type abortedTxn struct{ producer, first int64 }

// abortedTxns converts a response's list and sorts it by first offset.
func abortedTxns(in []kmsg.FetchResponseTopicPartitionAbortedTransaction) []abortedTxn {
	if len(in) == 0 {
		return nil
	}
	out := make([]abortedTxn, len(in))
	for i, a := range in {
		out[i] = abortedTxn{a.ProducerID, a.FirstOffset}
	}
	slices.SortFunc(out, func(a, b abortedTxn) int { return cmp.Compare(a.first, b.first) })
	return out
}

// txnFilter drops the batches of aborted transactions from one chunk. It
// is used by the partition's goroutine only, while it decodes the chunk.
type txnFilter struct {
	pending  []abortedTxn       // not reached yet, by first offset
	aborting map[int64]struct{} // producers whose transactional batches are dropped until their abort marker
}

func newTxnFilter(aborted []abortedTxn) *txnFilter {
	return &txnFilter{pending: aborted}
}

// reach moves every aborted transaction that starts at or before last
// into the aborting set.
func (t *txnFilter) reach(last int64) {
	for len(t.pending) > 0 && t.pending[0].first <= last {
		if t.aborting == nil {
			t.aborting = map[int64]struct{}{}
		}
		t.aborting[t.pending[0].producer] = struct{}{}
		t.pending = t.pending[1:]
	}
}

// aborted says whether a transactional batch of producer, ending at last,
// belongs to an aborted transaction.
func (t *txnFilter) aborted(producer, last int64) bool {
	t.reach(last)
	_, ok := t.aborting[producer]
	return ok
}

// marker reads a control batch of producer ending at last: an abort marker
// ends the producer's aborted transaction.
func (t *txnFilter) marker(producer, last int64, abort bool) {
	t.reach(last)
	if abort {
		delete(t.aborting, producer)
	}
}

// Control record types, from the key of a control batch's record.
const (
	controlAbort  = 0
	controlCommit = 1
)

// controlRecord reads the type of the control batch whose (decompressed)
// records are recs: the key of its first record is a version (int16) and a
// type (int16). A type this code does not know (Kafka may add some) is
// returned as is and treated as neither marker, as the Java client does.
func controlRecord(recs []byte, count int32) (int16, error) {
	if count < 1 {
		return 0, fmt.Errorf("control batch with %d records", count)
	}
	r := recordReader{b: recs}
	length, ok := r.varint()
	if !ok || length < 0 || length > int64(r.left()) {
		return 0, fmt.Errorf("control record: %w", errMalformed)
	}
	rec := r.sub(int(length))
	if rec.left() < 1 {
		return 0, fmt.Errorf("control record: %w", errMalformed)
	}
	rec.i++ // attributes
	_, ok1 := rec.varint()
	_, ok2 := rec.varint()
	key, ok3 := rec.bytes()
	if !(ok1 && ok2 && ok3) {
		return 0, fmt.Errorf("control record: %w", errMalformed)
	}
	if len(key) < 4 {
		return 0, fmt.Errorf("control record key of %d bytes, want at least 4 (version, type): %w", len(key), errMalformed)
	}
	if v := int16(binary.BigEndian.Uint16(key)); v < 0 {
		return 0, fmt.Errorf("control record key version %d: %w", v, errMalformed)
	}
	return int16(binary.BigEndian.Uint16(key[2:])), nil
}
