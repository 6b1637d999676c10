package tidemarktest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/tidemarktest"
)

// TestRunKeyOrder consumes keyed messages with OrderKey, many calls at
// once, and checks each was handled once and each key in order.
func TestRunKeyOrder(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "orders", 3)
	msgs := b.Produce(t, topic, tidemarktest.Keyed(300, 12)...)
	rec := tidemarktest.NewRecorder(handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error { return nil }))
	c := tidemarktest.Run(t, framework.Config{
		Brokers:     b.Brokers(),
		Topics:      []string{topic},
		Handler:     rec,
		Ordering:    framework.OrderKey,
		MaxInFlight: 8,
	}, tidemarktest.Processed(msgs))
	if err := rec.Check(msgs); err != nil {
		t.Fatal(err)
	}
	parts := map[int]bool{}
	for _, m := range msgs {
		parts[m.Partition] = true
	}
	if len(parts) < 2 {
		t.Errorf("12 keys landed in %d partition(s), want them spread", len(parts))
	}
	// Run stopped the consumer as a service stops: drained and committed.
	for _, p := range c.Stats().Partitions {
		if p.Committed != p.Processed {
			t.Errorf("%s/%d: committed %d, processed %d after Run", p.Topic, p.Partition, p.Committed, p.Processed)
		}
	}
}

// TestRunFindsSkipped shows the check in a real pipeline: a message the
// failure policy skipped was never handled, and is named as lost.
func TestRunFindsSkipped(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "payments", 1)
	msgs := b.Produce(t, topic, tidemarktest.Keyed(20, 4)...)
	rec := tidemarktest.NewRecorder(handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
		if m.Offset == 13 {
			return errors.New("malformed")
		}
		return nil
	}))
	tidemarktest.Run(t, framework.Config{
		Brokers: b.Brokers(),
		Topics:  []string{topic},
		Handler: rec,
		Failure: framework.FailurePolicy{Action: framework.Skip, MaxAttempts: 2},
	}, tidemarktest.Processed(msgs))
	var de *tidemarktest.DeliveryError
	if err := rec.Check(msgs); !errors.As(err, &de) || len(de.Lost) != 1 || de.Lost[0].Offset != 13 || string(de.Lost[0].Key) != "key-1" {
		t.Fatalf("Check = %v, want offset 13 (key-1) lost", err)
	}
	// The skipped message's calls failed, so the Recorder kept the 19 others.
	if rec.Count() != 19 {
		t.Errorf("recorded %d messages, want 19", rec.Count())
	}
}

// TestRunAgainRepeats runs two groups over one topic with one Recorder:
// each message handled twice, which Check reports and AllowDuplicates
// accepts.
func TestRunAgainRepeats(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "events", 2)
	msgs := b.Produce(t, topic, tidemarktest.Keyed(40, 5)...)
	rec := &tidemarktest.Recorder{}
	for range 2 {
		tidemarktest.Run(t, framework.Config{Brokers: b.Brokers(), Topics: []string{topic}, Handler: rec},
			tidemarktest.Handled(len(msgs)))
	}
	var de *tidemarktest.DeliveryError
	if err := rec.Check(msgs); !errors.As(err, &de) || len(de.Twice) != len(msgs) || len(de.Lost) != 0 || len(de.OutOfOrder) != 0 {
		t.Fatalf("Check = %v, want all %d handled twice", err, len(msgs))
	}
	if err := rec.Check(msgs, tidemarktest.AllowDuplicates()); err != nil {
		t.Fatalf("Check with AllowDuplicates = %v", err)
	}
}

// fatalTB is the test's T, but Fatalf records its message and ends only
// the goroutine that called it, so a test can look at what a helper
// reported.
type fatalTB struct {
	*testing.T
	msg string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestRunReportsNewError(t *testing.T) {
	f := &fatalTB{T: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		tidemarktest.Run(f, framework.Config{Topics: []string{"x"}, Handler: &tidemarktest.Recorder{}}, tidemarktest.Handled(1))
	}()
	<-done
	if !strings.HasPrefix(f.msg, "tidemarktest: New: ") || !strings.Contains(f.msg, "Brokers") {
		t.Errorf("Run without Brokers reported %q, want New's error naming Brokers", f.msg)
	}
}
