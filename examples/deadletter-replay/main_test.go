package main

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/tidemarktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDeadLetterReplay runs the round trip step by step on tidemarktest's
// broker (a real cluster when KAFKA_BROKERS is set): the buggy service
// handles the good payments and dead-letters the legacy ones, the replay
// writes them back, and the fixed service handles exactly those, once.
func TestDeadLetterReplay(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	src := b.CreateTopic(t, "payments", 3)
	dlt := b.CreateTopic(t, "payments.dlt", 3)
	all, legacy := payments(70)
	msgs := b.Produce(t, src, all...)
	var good, bad []kafka.Message
	for _, m := range msgs {
		id, _, _ := parsePayment(string(m.Value), true)
		if legacy[id] {
			bad = append(bad, m)
		} else {
			good = append(good, m)
		}
	}
	if len(bad) == 0 {
		t.Fatal("no legacy payment produced: the test would prove nothing")
	}

	// 1. The service with its bug.
	svc := NewPayments()
	rec := tidemarktest.NewRecorder(svc)
	cfg := serviceConfig(b.Brokers(), b.Name(t, "payments"), src, dlt, filepath.Join(t.TempDir(), "payments.db"), rec)
	c := tidemarktest.Run(t, cfg, tidemarktest.Processed(msgs))
	if err := rec.Check(good); err != nil {
		t.Fatalf("step 1, the good payments: %v", err)
	}
	for _, m := range rec.Handled() {
		if id, _, _ := parsePayment(string(m.Value), true); legacy[id] {
			t.Errorf("step 1: legacy payment %s at %s/%d offset %d handled by the buggy parser", id, m.Topic, m.Partition, m.Offset)
		}
	}
	var dead uint64
	for _, p := range c.Stats().Partitions {
		dead += p.DeadLettered
	}
	if dead != uint64(len(bad)) {
		t.Fatalf("step 1: %d dead-lettered, want %d", dead, len(bad))
	}

	// 2. The fix; 3. the replay, a Consumer of the dead-letter topic.
	svc.Fixed.Store(true)
	kc, err := kgo.NewClient(kgo.SeedBrokers(b.Brokers()...), kgo.ProducerLinger(0))
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	rp, err := NewReplayer(kc)
	if err != nil {
		t.Fatal(err)
	}
	rcfg := replayConfig(b.Brokers(), b.Name(t, "payments-replay"), dlt, filepath.Join(t.TempDir(), "replay.db"), rp)
	tidemarktest.Run(t, rcfg, tidemarktest.Handled(len(bad)))
	replayed := rp.Produced()
	if len(replayed) != len(bad) {
		t.Fatalf("step 3: %d replayed, want %d", len(replayed), len(bad))
	}
	// Each replayed message is a dead letter's original: same key, value
	// and headers, the failure's headers gone, its origin named.
	orig := map[string]kafka.Message{}
	for _, m := range bad {
		orig[fmt.Sprintf("%s/%d/%d", m.Topic, m.Partition, m.Offset)] = m
	}
	for _, m := range replayed {
		o, ok := orig[sourceOf(m)]
		switch {
		case !ok:
			t.Errorf("replayed %q names original %q, not a dead-lettered message", m.Value, sourceOf(m))
		case m.Topic != src || m.Partition != o.Partition || !bytes.Equal(m.Key, o.Key) || !bytes.Equal(m.Value, o.Value):
			t.Errorf("replayed %s/%d %q key %q, want %s/%d %q key %q", m.Topic, m.Partition, m.Value, m.Key, src, o.Partition, o.Value, o.Key)
		}
		delete(orig, sourceOf(m))
		for _, h := range m.Headers {
			if strings.HasPrefix(h.Key, "tidemark-") {
				t.Errorf("replayed %q keeps failure header %s", m.Value, h.Key)
			}
		}
		if len(m.Headers) == 0 || m.Headers[0].Key != "producer" {
			t.Errorf("replayed %q lost its own headers: %v", m.Value, m.Headers)
		}
	}

	// 4. The fixed service: same group, same offset file.
	rec.Reset()
	tidemarktest.Run(t, cfg, tidemarktest.Processed(replayed))
	if err := rec.Check(replayed); err != nil {
		t.Fatalf("step 4, the replayed payments: %v", err)
	}
	if n := rec.Count(); n != len(replayed) {
		t.Errorf("step 4: %d handled, want only the %d replayed (the service resumes at its watermark)", n, len(replayed))
	}

	// In the end: every payment booked once.
	booked := svc.Booked()
	for _, m := range all {
		id, _, _ := parsePayment(string(m.Value), true)
		if booked[id] != 1 {
			t.Errorf("payment %s booked %d times, want 1", id, booked[id])
		}
	}
	if len(booked) != len(all) {
		t.Errorf("%d payments booked, want %d", len(booked), len(all))
	}
}

// TestRun runs the program, as `go run` does, against tidemarktest's
// broker and topics of the test's own.
func TestRun(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	src := b.CreateTopic(t, "payments", 3)
	dlt := b.CreateTopic(t, "payments.dlt", 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	args := []string{"-brokers", strings.Join(b.Brokers(), ","), "-topic", src, "-dlt", dlt,
		"-group", b.Name(t, "payments"), "-dir", t.TempDir(), "-messages", "50"}
	if err := run(ctx, args, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	for _, re := range []string{
		`(?m)^1\. service \(parser v1\): 43 booked, 7 dead-lettered`,
		`(?m)^3\. replay: 7 dead letters read`,
		`(?m)^4\. service \(parser v2\): resumed at its watermark, 7 replayed payments booked$`,
		`(?m)^   booked exactly once: 50 of 50; lost 0; booked twice 0$`,
		`(?m)^OK$`,
	} {
		if !regexp.MustCompile(re).MatchString(out.String()) {
			t.Errorf("output does not match %s:\n%s", re, out.String())
		}
	}
}

// TestRunInProcess is `go run ./examples/deadletter-replay` with no flag.
func TestRunInProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, []string{"-messages", "30"}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "booked exactly once: 30 of 30; lost 0; booked twice 0\nOK\n") {
		t.Errorf("no all-clear:\n%s", out.String())
	}
}
