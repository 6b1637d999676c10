package offsetfile_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

func Example() {
	dir, err := os.MkdirTemp("", "offsetstore-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "offsets.db")

	s, err := offsetfile.Open(path, nil)
	if err != nil {
		log.Fatal(err)
	}
	k := offsetfile.Key{Group: "billing", Topic: "orders", Partition: 3}

	// The handler finished offsets up to 41: the next one to process is 42.
	if err := s.SetWatermark(k, 42, 7, "consumer-1"); err != nil {
		log.Fatal(err)
	}
	latest, _ := s.Get(k)
	fmt.Println("latest watermark:", latest.Watermark)

	// Wait until it is on disk; only then may it be committed to Kafka.
	if err := s.Flush(context.Background()); err != nil {
		log.Fatal(err)
	}
	durable, _ := s.Durable(k)
	fmt.Println("durable watermark:", durable.Watermark)
	if err := s.SetCommitted(k, durable.Watermark); err != nil {
		log.Fatal(err)
	}
	if err := s.Close(); err != nil { // flushes SetCommitted
		log.Fatal(err)
	}

	// A tool reads the file without taking it from the consumer for long.
	ro, err := offsetfile.Open(path, &offsetfile.Options{ReadOnly: true})
	if err != nil {
		log.Fatal(err)
	}
	defer ro.Close()
	for _, e := range ro.Records() {
		fmt.Printf("%s/%s/%d: watermark %d (generation %d, %s), committed %d\n",
			e.Group, e.Topic, e.Partition, e.Watermark, e.Generation, e.Member, e.Committed)
	}
	// Output:
	// latest watermark: 42
	// durable watermark: 42
	// billing/orders/3: watermark 42 (generation 7, consumer-1), committed 42
}

// A consumer that completes a partition's messages out of order records
// its watermark with the offsets completed above it, read when the store
// folds them.
func ExampleStore_NewProgressMarker() {
	dir, err := os.MkdirTemp("", "offsetstore-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	s, err := offsetfile.Open(filepath.Join(dir, "offsets.db"), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	k := offsetfile.Key{Group: "billing", Topic: "orders", Partition: 3}

	// The consumer's own state, guarded by its own lock.
	var (
		mu   sync.Mutex
		wm   int64 = 42
		done []offsetfile.Range
	)
	m, err := s.NewProgressMarker(k, 7, "consumer-1", func() (int64, []offsetfile.Range) {
		mu.Lock()
		defer mu.Unlock()
		return wm, slices.Clone(done) // the store owns what is returned
	})
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()

	// Offsets 44, 45 and 50 completed while 42 is still being handled.
	mu.Lock()
	done = []offsetfile.Range{{From: 44, To: 46}, {From: 50, To: 51}}
	mu.Unlock()
	m.Changed()

	if err := s.Flush(context.Background()); err != nil {
		log.Fatal(err)
	}
	rec, _ := s.Durable(k)
	fmt.Println("watermark:", rec.Watermark, "completed above it:", rec.Completed)
	// Output:
	// watermark: 42 completed above it: [{44 46} {50 51}]
}
