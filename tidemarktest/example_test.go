package tidemarktest_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/tidemarktest"
)

// Test a handler that keeps a running total per account: every message
// handled once, each account's in order, on an in-process broker.
func Example() {
	t := exampleT() // in a test: the test's *testing.T
	defer t.cleanup()

	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "deposits", 2)
	msgs := b.Produce(t, topic, tidemarktest.Keyed(100, 4)...) // key-0 ... key-3

	var mu sync.Mutex
	totals := map[string]int{}
	deposit := handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
		mu.Lock()
		defer mu.Unlock()
		totals[string(m.Key)]++
		return nil
	})
	rec := tidemarktest.NewRecorder(deposit)
	tidemarktest.Run(t, framework.Config{
		Brokers:  b.Brokers(),
		Topics:   []string{topic},
		Handler:  rec,
		Ordering: framework.OrderKey,
	}, tidemarktest.Processed(msgs))

	if err := rec.Check(msgs); err != nil {
		t.Fatal(err)
	}
	fmt.Println(rec.Count(), "handled:", totals)
	// Output:
	// 100 handled: map[key-0:25 key-1:25 key-2:25 key-3:25]
}

// Check what a stop leaves committed in Kafka, where a restart or another
// member of the group resumes: run until every partition's commit is at
// its log end, then read the commits.
func ExampleBroker_CommittedAtEnd() {
	t := exampleT()
	defer t.cleanup()

	b := tidemarktest.NewBroker(t)
	topic := b.CreateTopic(t, "invoices", 2)
	b.Produce(t, topic, tidemarktest.Keyed(40, 4)...)
	group := b.Name(t, "billing")
	tidemarktest.Run(t, framework.Config{
		Brokers: b.Brokers(),
		GroupID: group,
		Topics:  []string{topic},
		Handler: &tidemarktest.Recorder{},
	}, b.CommittedAtEnd(t, topic))

	fmt.Println(b.Committed(t, group, topic))
	// Output:
	// map[0:20 1:20]
}

// exampleT stands in for a test's *testing.T, so that the example can run
// (and check its output) outside a test function: it implements the
// methods tidemarktest and zaptest call.
func exampleT() *standIn { return &standIn{} }

type standIn struct {
	testing.TB // not set: a method not below would panic
	mu         sync.Mutex
	cleanups   []func()
	ctx        context.Context
	cancel     context.CancelFunc
}

func (s *standIn) Helper()                      {}
func (s *standIn) Name() string                 { return "Example" }
func (s *standIn) Logf(string, ...any)          {}
func (s *standIn) Failed() bool                 { return false }
func (s *standIn) Errorf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (s *standIn) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
func (s *standIn) Fatal(args ...any)            { panic(fmt.Sprint(args...)) }
func (s *standIn) Error(args ...any)            { panic(fmt.Sprint(args...)) }
func (s *standIn) Cleanup(f func())             { s.mu.Lock(); s.cleanups = append(s.cleanups, f); s.mu.Unlock() }
func (s *standIn) Context() context.Context     { s.initCtx(); return s.ctx }
func (s *standIn) initCtx() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx == nil {
		s.ctx, s.cancel = context.WithCancel(context.Background())
	}
}

func (s *standIn) TempDir() string {
	dir, err := os.MkdirTemp("", "tidemarktest-example-"+strings.ToLower(s.Name()))
	if err != nil {
		panic(err)
	}
	s.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// cleanup cancels Context and runs the cleanups, last first, as a test's
// end does.
func (s *standIn) cleanup() {
	s.initCtx()
	s.cancel()
	for i := len(s.cleanups) - 1; i >= 0; i-- {
		s.cleanups[i]()
	}
}
