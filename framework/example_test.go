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
	"github.com/tidemark/tidemark/offsetstore"
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

	s, err := offsetstore.Open(file, &offsetstore.Options{ReadOnly: true})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	skipped, _ := s.Failures(offsetstore.Key{Group: "analytics", Topic: "clicks", Partition: 0})
	for _, f := range skipped {
		fmt.Printf("offset %d %s after %d attempts: %s\n", f.Offset, f.Action, f.Attempts, f.Reason)
	}
	// Output:
	// processed=5 skipped=1
	// offset 2 skipped after 3 attempts: malformed click
}
