package framework

import (
	"slices"
	"testing"
	"time"
)

// A restoring partition's row says how far its restore is, and a
// rebuilt one how often it was rebuilt.
func TestPartitionRowShowsRestore(t *testing.T) {
	p := PartitionStats{Topic: "orders", Partition: 3, State: StateReconciling, Processed: -1, Durable: -1, Committed: 40,
		HighWatermark: 90, LastStable: -1, OldestIncomplete: -1, Restoring: true, RestoreTotal: 1200, RestoreRemaining: 800}
	r := partitionRowOf(p, time.Now())
	if want := "restoring its state: 1200 changelog records read, 800 left"; !slices.Contains(r.Flags, want) {
		t.Errorf("flags %q, want one %q", r.Flags, want)
	}
	p.Restoring, p.StateRebuilds = false, 2
	r = partitionRowOf(p, time.Now())
	if want := "state rebuilt from the log start 2 time(s)"; !slices.Contains(r.Flags, want) || len(r.Flags) != 1 {
		t.Errorf("flags %q, want only %q", r.Flags, want)
	}
}
