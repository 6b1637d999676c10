package tidemarktest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/tidemarktest"
)

// produced is what Broker.Produce would return for 3 keys of one
// partition of "orders": offset i has key "key-<i%3>".
func produced(n int) []kafka.Message {
	msgs := tidemarktest.Keyed(n, 3)
	for i := range msgs {
		msgs[i].Topic, msgs[i].Partition, msgs[i].Offset = "orders", 1, int64(i)
	}
	return msgs
}

// handle feeds rec the messages of want at the given offsets, in order.
func handle(t *testing.T, rec *tidemarktest.Recorder, want []kafka.Message, offsets ...int) {
	t.Helper()
	for _, o := range offsets {
		if err := rec.Handle(context.Background(), want[o]); err != nil {
			t.Fatal(err)
		}
	}
}

func deliveryError(t *testing.T, err error) *tidemarktest.DeliveryError {
	t.Helper()
	var de *tidemarktest.DeliveryError
	if !errors.As(err, &de) {
		t.Fatalf("Check = %v, want a *DeliveryError", err)
	}
	return de
}

func TestCheckClean(t *testing.T) {
	want := produced(6)
	rec := &tidemarktest.Recorder{}
	// Keys interleave in any way as long as each key's offsets increase.
	handle(t, rec, want, 1, 0, 2, 4, 3, 5)
	if err := rec.Check(want); err != nil {
		t.Fatalf("Check = %v, want nil", err)
	}
	if rec.Count() != 6 || rec.Calls() != 6 {
		t.Errorf("Count, Calls = %d, %d, want 6, 6", rec.Count(), rec.Calls())
	}
}

func TestCheckLost(t *testing.T) {
	want := produced(6)
	rec := &tidemarktest.Recorder{}
	handle(t, rec, want, 0, 1, 2, 5)
	err := rec.Check(want)
	de := deliveryError(t, err)
	if len(de.Lost) != 2 || de.Lost[0].Offset != 3 || de.Lost[1].Offset != 4 || len(de.Twice)+len(de.OutOfOrder) != 0 {
		t.Fatalf("Lost %v, Twice %v, OutOfOrder %v; want offsets 3 and 4 lost, nothing else", de.Lost, de.Twice, de.OutOfOrder)
	}
	const msg = `tidemarktest: 6 messages checked: 2 lost, first orders/1 offset 3 key "key-0"`
	if err.Error() != msg {
		t.Errorf("Error() = %q, want %q", err, msg)
	}
}

func TestCheckTwice(t *testing.T) {
	want := produced(6)
	rec := &tidemarktest.Recorder{}
	// 4 and then 1 handled again, as after a restart from an old offset:
	// repeats, not reorderings.
	handle(t, rec, want, 0, 1, 2, 3, 4, 4, 1, 4, 5)
	err := rec.Check(want)
	de := deliveryError(t, err)
	if len(de.Twice) != 2 || de.Twice[0].Offset != 1 || de.Twice[0].Times != 2 || de.Twice[1].Offset != 4 || de.Twice[1].Times != 3 ||
		len(de.Lost)+len(de.OutOfOrder) != 0 {
		t.Fatalf("Lost %v, Twice %v, OutOfOrder %v; want offset 1 twice and 4 three times, nothing else", de.Lost, de.Twice, de.OutOfOrder)
	}
	const msg = `tidemarktest: 6 messages checked: 2 handled more than once, first orders/1 offset 1 key "key-1" (2 times)`
	if err.Error() != msg {
		t.Errorf("Error() = %q, want %q", err, msg)
	}
	if err := rec.Check(want, tidemarktest.AllowDuplicates()); err != nil {
		t.Errorf("Check with AllowDuplicates = %v, want nil", err)
	}
}

func TestCheckOutOfOrder(t *testing.T) {
	want := produced(9)
	rec := &tidemarktest.Recorder{}
	// key-1 is 1, 4, 7: 7 before 4 breaks its order; key-0 and key-2 keep
	// theirs though they interleave with it.
	handle(t, rec, want, 0, 1, 2, 3, 7, 5, 6, 4, 8)
	err := rec.Check(want)
	de := deliveryError(t, err)
	if len(de.OutOfOrder) != 1 || de.OutOfOrder[0].Offset != 4 || de.OutOfOrder[0].After != 7 || len(de.Lost)+len(de.Twice) != 0 {
		t.Fatalf("Lost %v, Twice %v, OutOfOrder %v; want offset 4 out of order after 7, nothing else", de.Lost, de.Twice, de.OutOfOrder)
	}
	const msg = `tidemarktest: 9 messages checked: 1 out of key order, first orders/1 offset 4 key "key-1" (handled after offset 7)`
	if err.Error() != msg {
		t.Errorf("Error() = %q, want %q", err, msg)
	}
	if err := rec.Check(want, tidemarktest.IgnoreOrder()); err != nil {
		t.Errorf("Check with IgnoreOrder = %v, want nil", err)
	}
}

func TestCheckAllKinds(t *testing.T) {
	want := produced(9)
	// Two topics: the report is in topic, partition, offset order.
	other := produced(3)
	for i := range other {
		other[i].Topic = "audit"
	}
	want = append(want, other...)
	rec := &tidemarktest.Recorder{}
	// key-2 of orders is 2, 5, 8: 5 comes after 8. Offsets 9-11 are audit's.
	handle(t, rec, want, 0, 2, 8, 5, 3, 3, 9, 10, 11, 11)
	err := rec.Check(want)
	de := deliveryError(t, err)
	if got := fmt.Sprint(de.Lost); got != `[orders/1 offset 1 key "key-1" orders/1 offset 4 key "key-1" orders/1 offset 6 key "key-0" orders/1 offset 7 key "key-1"]` {
		t.Errorf("Lost = %s", got)
	}
	if len(de.Twice) != 2 || de.Twice[0].Topic != "audit" || de.Twice[0].Offset != 2 || de.Twice[1].Topic != "orders" || de.Twice[1].Offset != 3 {
		t.Errorf("Twice = %v, want audit/1 offset 2, then orders/1 offset 3", de.Twice)
	}
	if len(de.OutOfOrder) != 1 || de.OutOfOrder[0].Offset != 5 || de.OutOfOrder[0].After != 8 {
		t.Errorf("OutOfOrder = %v, want orders/1 offset 5 after 8", de.OutOfOrder)
	}
	const msg = `tidemarktest: 12 messages checked: 4 lost, first orders/1 offset 1 key "key-1"; ` +
		`2 handled more than once, first audit/1 offset 2 key "key-2" (2 times); ` +
		`1 out of key order, first orders/1 offset 5 key "key-2" (handled after offset 8)`
	if err.Error() != msg {
		t.Errorf("Error() =\n%s\nwant\n%s", err, msg)
	}
}

// TestCheckAltered: a message handed over with another value or key than
// the one produced at its offset (a decoder that misaligns records) is
// named, once however often it was handled; a null and an empty value are
// the same.
func TestCheckAltered(t *testing.T) {
	want := produced(5)
	want[4].Value = nil
	rec := &tidemarktest.Recorder{}
	got := append([]kafka.Message(nil), want...)
	got[1].Value = []byte("message-2") // offset 2's value at offset 1
	got[3].Key = []byte("key-9")
	got[4].Value = []byte{}
	for _, i := range []int{0, 1, 2, 3, 3, 4} {
		if err := rec.Handle(context.Background(), got[i]); err != nil {
			t.Fatal(err)
		}
	}
	err := rec.Check(want, tidemarktest.AllowDuplicates())
	de := deliveryError(t, err)
	if len(de.Altered) != 2 || de.Altered[0].Offset != 1 || de.Altered[1].Offset != 3 || de.Altered[1].Times != 2 ||
		string(de.Altered[1].Key) != "key-0" || len(de.Lost)+len(de.Twice)+len(de.OutOfOrder) != 0 {
		t.Fatalf("Altered %v, Lost %v, Twice %v, OutOfOrder %v; want offsets 1 and 3 (handled twice, produced with key-0) altered, nothing else",
			de.Altered, de.Lost, de.Twice, de.OutOfOrder)
	}
	const msg = `tidemarktest: 5 messages checked: 2 handled with another key or value than produced, first orders/1 offset 1 key "key-1"`
	if err.Error() != msg {
		t.Errorf("Error() = %q, want %q", err, msg)
	}
}

func TestCheckIgnoresWhatWasNotWanted(t *testing.T) {
	all := produced(6)
	rec := &tidemarktest.Recorder{}
	handle(t, rec, all, 0, 1, 2, 0, 3, 4, 5)
	// Offset 0 handled twice is outside the second half, which alone is
	// checked.
	if err := rec.Check(all[3:]); err != nil {
		t.Errorf("Check of offsets 3-5 = %v, want nil", err)
	}
}

func TestRecorderRecordsOnlyWhatWasHandled(t *testing.T) {
	want := produced(3)
	failing := errors.New("not yet")
	tries := 0
	rec := tidemarktest.NewRecorder(handlerFunc(func(m kafka.Message) error {
		if m.Offset == 1 {
			if tries++; tries < 3 {
				return failing
			}
		}
		return nil
	}))
	for _, m := range []kafka.Message{want[0], want[1], want[1], want[1], want[2]} {
		_ = rec.Handle(context.Background(), m)
	}
	if err := rec.Check(want); err != nil {
		t.Errorf("Check = %v, want nil: failed calls are not handled", err)
	}
	if rec.Calls() != 5 || rec.Count() != 3 {
		t.Errorf("Calls, Count = %d, %d, want 5, 3", rec.Calls(), rec.Count())
	}

	// A batch is recorded whole or not at all.
	brec := tidemarktest.NewBatchRecorder(batchFunc(func(msgs []kafka.Message) error {
		if len(msgs) > 1 {
			return failing
		}
		return nil
	}))
	if err := brec.HandleBatch(context.Background(), want); err == nil {
		t.Fatal("HandleBatch of 3 = nil, want the error")
	}
	for _, m := range want {
		if err := brec.HandleBatch(context.Background(), []kafka.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	if err := brec.Check(want); err != nil {
		t.Errorf("batch Check = %v, want nil", err)
	}
}

type handlerFunc func(kafka.Message) error

func (f handlerFunc) Handle(_ context.Context, m kafka.Message) error { return f(m) }

type batchFunc func([]kafka.Message) error

func (f batchFunc) HandleBatch(_ context.Context, msgs []kafka.Message) error { return f(msgs) }
