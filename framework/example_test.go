package framework_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

// Consume a topic from an in-process broker, stop once everything was
// handled, and look at the positions the consumer recorded.
func Example() {
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"))
	if err != nil {
		panic(err)
	}
	defer broker.Close()
	addr := broker.ListenAddrs()[0]
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: "orders", Balancer: &kafka.RoundRobin{}, BatchTimeout: time.Millisecond, Transport: tr}
	for i := 0; i < 10; i++ {
		if err := w.WriteMessages(context.Background(), kafka.Message{Value: fmt.Appendf(nil, "order %d", i)}); err != nil {
			panic(err)
		}
	}
	_ = w.Close()

	dir, _ := os.MkdirTemp("", "tidemark-example")
	defer os.RemoveAll(dir)
	ctx, stop := context.WithCancel(context.Background())
	var mu sync.Mutex
	handled := 0
	c, err := framework.New(framework.Config{
		Brokers:    []string{addr},
		GroupID:    "billing",
		Topics:     []string{"orders"},
		OffsetFile: filepath.Join(dir, "offsets.db"),
		Handler: handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if handled++; handled == 10 {
				stop() // a real service stops on SIGTERM instead
			}
			return nil
		}),
	})
	if err != nil {
		panic(err)
	}
	if err := c.Run(ctx); err != nil { // blocks; drains and commits on cancel
		panic(err)
	}
	for _, p := range c.Stats().Partitions {
		fmt.Printf("%s/%d processed=%d durable=%d committed=%d\n", p.Topic, p.Partition, p.Processed, p.Durable, p.Committed)
	}
	// Output:
	// orders/0 processed=5 durable=5 committed=5
	// orders/1 processed=5 durable=5 committed=5
}

// Skip a message that keeps failing after three attempts, and find it
// listed in the offset file afterwards.
func ExampleFailurePolicy() {
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "clicks"))
	if err != nil {
		panic(err)
	}
	defer broker.Close()
	addr := broker.ListenAddrs()[0]
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: "clicks", BatchTimeout: time.Millisecond, Transport: tr}
	for i := 0; i < 5; i++ {
		if err := w.WriteMessages(context.Background(), kafka.Message{Value: fmt.Appendf(nil, "click %d", i)}); err != nil {
			panic(err)
		}
	}
	_ = w.Close()

	dir, _ := os.MkdirTemp("", "tidemark-example")
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "offsets.db")
	ctx, stop := context.WithCancel(context.Background())
	c, err := framework.New(framework.Config{
		Brokers:      []string{addr},
		GroupID:      "analytics",
		Topics:       []string{"clicks"},
		OffsetFile:   file,
		RetryBackoff: time.Millisecond,
		Failure:      framework.FailurePolicy{Action: framework.Skip, MaxAttempts: 3},
		Handler: handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
			if m.Offset == 2 {
				return errors.New("malformed click")
			}
			if m.Offset == 4 {
				stop()
			}
			return nil
		}),
	})
	if err != nil {
		panic(err)
	}
	if err := c.Run(ctx); err != nil {
		panic(err)
	}
	p := c.Stats().Partitions[0]
	fmt.Printf("processed=%d skipped=%d\n", p.Processed, p.Skipped)

	s, err := offsetfile.Open(file, &offsetfile.Options{ReadOnly: true})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	skipped, _ := s.Failures(offsetfile.Key{Group: "analytics", Topic: "clicks", Partition: 0})
	for _, f := range skipped {
		// The entry's Action is the policy's: framework.Skip here.
		fmt.Printf("offset %d: %s after %d attempts: %s\n", f.Offset, f.Action, f.Attempts, f.Reason)
	}
	// Output:
	// processed=5 skipped=1
	// offset 2: skip after 3 attempts: malformed click
}

// Handle a slow call per message with the messages of each key in order and
// different keys at once, in batches of up to 10 messages of one key.
func ExampleOrdering() {
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "accounts"))
	if err != nil {
		panic(err)
	}
	defer broker.Close()
	addr := broker.ListenAddrs()[0]
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: "accounts", BatchTimeout: time.Millisecond, Transport: tr, BatchSize: 100}
	var msgs []kafka.Message
	for i := 0; i < 100; i++ {
		msgs = append(msgs, kafka.Message{Key: fmt.Appendf(nil, "account-%d", i%4), Value: fmt.Appendf(nil, "%d", i)})
	}
	if err := w.WriteMessages(context.Background(), msgs...); err != nil {
		panic(err)
	}
	_ = w.Close()

	dir, _ := os.MkdirTemp("", "tidemark-example")
	defer os.RemoveAll(dir)
	ctx, stop := context.WithCancel(context.Background())
	var mu sync.Mutex
	last := map[string]int64{} // per key, the last offset handled
	handled := 0
	c, err := framework.New(framework.Config{
		Brokers:    []string{addr},
		GroupID:    "ledger",
		Topics:     []string{"accounts"},
		OffsetFile: filepath.Join(dir, "offsets.db"),
		Ordering:   framework.OrderKey,
		BatchSize:  10,
		BatchHandler: handler.BatchHandlerFunc(func(ctx context.Context, batch []kafka.Message) error {
			time.Sleep(10 * time.Millisecond) // one round trip per batch
			mu.Lock()
			defer mu.Unlock()
			for _, m := range batch {
				if prev, ok := last[string(m.Key)]; ok && prev >= m.Offset {
					panic("a key's messages out of order")
				}
				last[string(m.Key)] = m.Offset
			}
			if handled += len(batch); handled == 100 {
				stop()
			}
			return nil
		}),
	})
	if err != nil {
		panic(err)
	}
	if err := c.Run(ctx); err != nil {
		panic(err)
	}
	p := c.Stats().Partitions[0]
	fmt.Printf("%d keys, processed=%d committed=%d in flight=%d\n", len(last), p.Processed, p.Committed, p.InFlight)
	// Output:
	// 4 keys, processed=100 committed=100 in flight=0
}
