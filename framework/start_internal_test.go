package framework

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap/zaptest"

	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// A run that starts parked is fetched before its start is durable, and
// handles nothing until it is: here persist waits until the first answer's
// messages wait in the inboxes, and each Handler call must find its
// partition's run recorded open, and a watermark at or below its offset,
// in the offset file's durable records.
func TestEarlyFetchWaitsForPersist(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	const parts, each = 20, 5
	cl.CreateTopic(t, topic, parts)
	cl.Produce(t, topic, parts, 0, each)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var c *Consumer
	var mu sync.Mutex
	var bad []string
	handled := 0
	all := make(chan struct{})
	h := handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
		rec, ok := c.store.Durable(storeKey(group, topicPartition{m.Topic, int32(m.Partition)}))
		mu.Lock()
		defer mu.Unlock()
		if !ok || rec.Run == nil || !rec.Run.Open || rec.Watermark < 0 || rec.Watermark > m.Offset {
			bad = append(bad, fmt.Sprintf("%d@%d: %+v", m.Partition, m.Offset, rec))
		}
		if handled++; handled == parts*each {
			close(all)
		}
		return nil
	})
	c, err := New(Config{Brokers: cl.Brokers, GroupID: group, Topics: []string{topic},
		OffsetFile: filepath.Join(t.TempDir(), "o.db"), InspectSocket: InspectDisabled,
		Handler: h, Logger: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	buffered := int64(-1)
	c.assignment.beforePersist = func() {
		for deadline := time.Now().Add(20 * time.Second); c.fetcher.buffered.Load() == 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		buffered = c.fetcher.buffered.Load()
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("handled %d of %d messages", handled, parts*each)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if buffered <= 0 {
		t.Fatalf("nothing was fetched before persist (%d bytes buffered): the runs were not fetched early", buffered)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bad) > 0 {
		t.Fatalf("%d Handler calls before their partition's start was durable, the first: %s", len(bad), bad[0])
	}
	t.Logf("%d bytes were fetched before persist; %d messages handled after it", buffered, handled)
}
