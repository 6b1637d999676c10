package offsetstore_test

import (
	"sync"
	"testing"

	"github.com/tidemark/tidemark/offsetstore"
)

func TestMarker(t *testing.T) {
	s := mustOpenStore(t, nil)
	k := offsetstore.Key{Group: "g", Topic: "t", Partition: 3}
	m, err := s.NewMarker(k, 7, "member-a")
	must(t, err)
	for wm := int64(1); wm <= 1000; wm++ {
		m.Set(wm)
	}
	if rec, _ := s.Get(k); rec.Watermark != 1000 || rec.Generation != 7 || rec.Member != "member-a" {
		t.Fatalf("Get after Set: %+v, want watermark 1000 of generation 7, member-a", rec)
	}
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 1000 {
		t.Fatalf("durable watermark %d after Flush, want 1000", rec.Watermark)
	}

	// Order with the other updates of the key is kept: a reset queued after
	// a Set wins, a Set after the reset wins over it.
	m.Set(1500)
	must(t, s.RecordReset(k, offsetstore.Reset{From: 1500, To: 2000, Reason: "test"}))
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 2000 || rec.LastReset == nil {
		t.Fatalf("after Set(1500) then a reset to 2000: %+v", rec)
	}
	m.Set(2001)
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 2001 {
		t.Fatalf("after a reset then Set(2001): watermark %d", rec.Watermark)
	}

	// Set from one goroutine while Flush runs from another: the last value
	// is durable after the last Flush.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for wm := int64(3000); wm < 20000; wm++ {
			m.Set(wm)
		}
	}()
	for i := 0; i < 20; i++ {
		flush(t, s)
	}
	wg.Wait()
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 19999 {
		t.Fatalf("durable watermark %d, want 19999", rec.Watermark)
	}
	m.Set(20000)
	m.Close()
	m.Set(30000) // after Close: ignored
	flush(t, s)
	if rec, _ := s.Durable(k); rec.Watermark != 20000 {
		t.Fatalf("durable watermark %d after Close", rec.Watermark)
	}
	if _, err := s.NewMarker(offsetstore.Key{Group: "", Topic: "t"}, 1, "m"); err == nil {
		t.Fatal("NewMarker accepted an empty group")
	}
}
