package tidemarktest

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"
)

// A CheckOption relaxes Check.
type CheckOption func(*checkConfig)

type checkConfig struct {
	duplicates bool
	order      bool
}

// AllowDuplicates accepts a message handled more than once, for a test of
// at-least-once delivery (a crash, say): only the lost and out-of-order
// messages fail the check.
func AllowDuplicates() CheckOption { return func(c *checkConfig) { c.duplicates = true } }

// IgnoreOrder turns off the per-key order check, for a consumer with
// framework.OrderNone.
func IgnoreOrder() CheckOption { return func(c *checkConfig) { c.order = false } }

// A Delivery is one message named in a DeliveryError.
type Delivery struct {
	Topic     string
	Partition int
	Offset    int64
	Key       []byte
	// Times is how many times the message was handled.
	Times int
	// After is, for a message out of order, the offset of a later message
	// of its key that was handled before it; -1 otherwise.
	After int64
}

// String names the message: `orders/2 offset 17 key "key-3"`.
func (d Delivery) String() string {
	key := "no key"
	if d.Key != nil {
		key = fmt.Sprintf("key %q", d.Key)
	}
	return fmt.Sprintf("%s/%d offset %d %s", d.Topic, d.Partition, d.Offset, key)
}

// A DeliveryError is Check's report of what went wrong. Each list is in
// topic, partition and offset order, so its first entry is the first
// offending message of its kind.
type DeliveryError struct {
	// Messages is the number of messages checked.
	Messages int
	// Lost were never handled; Twice were handled more than once;
	// OutOfOrder were handled for the first time after a later message of
	// their key (in their partition) had been.
	Lost, Twice, OutOfOrder []Delivery
	// Altered were handed to the Handler with a key or value other than
	// the one produced at their offset (Key is the one produced).
	Altered []Delivery
}

// Error counts each kind of fault and names the first of each.
func (e *DeliveryError) Error() string {
	var parts []string
	if n := len(e.Lost); n > 0 {
		parts = append(parts, fmt.Sprintf("%d lost, first %s", n, e.Lost[0]))
	}
	if n := len(e.Twice); n > 0 {
		parts = append(parts, fmt.Sprintf("%d handled more than once, first %s (%d times)", n, e.Twice[0], e.Twice[0].Times))
	}
	if n := len(e.OutOfOrder); n > 0 {
		parts = append(parts, fmt.Sprintf("%d out of key order, first %s (handled after offset %d)", n, e.OutOfOrder[0], e.OutOfOrder[0].After))
	}
	if n := len(e.Altered); n > 0 {
		parts = append(parts, fmt.Sprintf("%d handled with another key or value than produced, first %s", n, e.Altered[0]))
	}
	return fmt.Sprintf("tidemarktest: %d messages checked: %s", e.Messages, strings.Join(parts, "; "))
}

// position identifies a message: its topic, partition and offset.
type position struct {
	topic     string
	partition int
	offset    int64
}

// keyOf identifies a key's sequence: messages of one key in one partition.
type keyOf struct {
	topic     string
	partition int
	key       string
}

// Check compares what r recorded with want, the messages produced (as
// Broker.Produce returns them, with Topic, Partition and Offset set). It
// returns nil if each message of want was handled exactly once, with the
// key and value produced, and, for each key of each partition, first
// handled in offset order; otherwise a *DeliveryError naming what was
// lost, handled twice, out of order or altered. (A null and an empty key
// or value are taken as equal.)
// Messages handled that are not in want are ignored; messages without a
// key have no order to keep.
func (r *Recorder) Check(want []kafka.Message, opts ...CheckOption) error {
	cfg := checkConfig{order: true}
	for _, o := range opts {
		o(&cfg)
	}
	wanted := make(map[position]kafka.Message, len(want))
	for _, m := range want {
		wanted[position{m.Topic, m.Partition, m.Offset}] = m
	}
	times := make(map[position]int, len(want))
	latest := map[keyOf]int64{} // per key, the highest offset handled
	altered := map[position]bool{}
	e := &DeliveryError{Messages: len(wanted)}
	for _, m := range r.Handled() {
		pos := position{m.Topic, m.Partition, m.Offset}
		w, ok := wanted[pos]
		if !ok {
			continue
		}
		if times[pos]++; !bytes.Equal(m.Key, w.Key) || !bytes.Equal(m.Value, w.Value) {
			if !altered[pos] {
				altered[pos] = true
				e.Altered = append(e.Altered, delivery(w, 0, -1))
			}
		}
		if times[pos] > 1 || m.Key == nil {
			continue // a repeat is counted as such, not as a reordering
		}
		k := keyOf{m.Topic, m.Partition, string(m.Key)}
		if last, ok := latest[k]; ok && last > m.Offset {
			if cfg.order {
				e.OutOfOrder = append(e.OutOfOrder, delivery(m, 1, last))
			}
			continue
		}
		latest[k] = m.Offset
	}
	for _, l := range [][]Delivery{e.OutOfOrder, e.Altered} {
		for i, d := range l {
			l[i].Times = times[position{d.Topic, d.Partition, d.Offset}]
		}
	}
	for pos, m := range wanted {
		switch n := times[pos]; {
		case n == 0:
			e.Lost = append(e.Lost, delivery(m, 0, -1))
		case n > 1 && !cfg.duplicates:
			e.Twice = append(e.Twice, delivery(m, n, -1))
		}
	}
	if len(e.Lost) == 0 && len(e.Twice) == 0 && len(e.OutOfOrder) == 0 && len(e.Altered) == 0 {
		return nil
	}
	for _, l := range [][]Delivery{e.Lost, e.Twice, e.OutOfOrder, e.Altered} {
		slices.SortFunc(l, func(a, b Delivery) int {
			return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition), cmp.Compare(a.Offset, b.Offset))
		})
	}
	return e
}

func delivery(m kafka.Message, times int, after int64) Delivery {
	return Delivery{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Times: times, After: after}
}

// Verify is Check that reports a fault with t.Error: the test goes on, and
// fails.
func (r *Recorder) Verify(t testing.TB, want []kafka.Message, opts ...CheckOption) {
	t.Helper()
	if err := r.Check(want, opts...); err != nil {
		t.Error(err)
	}
}
