package wire

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A suspect seed (a broker whose fetches fail or go unanswered) is tried
// after the others: a lookup is answered by a healthy broker without
// waiting on one that accepts connections and answers nothing, as a Kafka
// node shutting down does.
func TestSuspectSeedTriedLast(t *testing.T) {
	fake, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	var accepted atomic.Int32
	go func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			defer c.Close() // held open, never answered
		}
	}()
	cl := NewClient([]string{mute.Addr().String(), fake.ListenAddrs()[0]}, Options{ClientID: "test", Timeout: 2 * time.Second})
	defer cl.Close()
	ctx := context.Background()

	cl.Suspect(mute.Addr().String(), time.Minute)
	start := time.Now()
	if _, err := cl.Any(ctx, kmsg.NewPtrMetadataRequest(), 5*time.Second); err != nil {
		t.Fatalf("metadata with the mute seed suspect: %v", err)
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the suspect seed was dialed %d times, want 0 (answered in %s)", n, time.Since(start))
	}

	// Not suspect (expired), it is tried first and costs the dial's
	// timeout: what Suspect saves.
	cl.Suspect(mute.Addr().String(), -time.Second)
	cl.mu.Lock()
	cl.next = 0
	cl.mu.Unlock()
	start = time.Now()
	if _, err := cl.Any(ctx, kmsg.NewPtrMetadataRequest(), 5*time.Second); err != nil {
		t.Fatalf("metadata after the mute seed: %v", err)
	}
	if took := time.Since(start); accepted.Load() != 1 || took < time.Second {
		t.Errorf("without Suspect: the mute seed dialed %d times, answered in %s; want 1, after its 2 s dial timeout", accepted.Load(), took)
	}
}
