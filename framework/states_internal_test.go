package framework

import (
	"os"
	"regexp"
	"slices"
	"testing"
)

// TestPartitionStatesListsEveryState reads stats.go for the PartitionState
// constants: a state added there and not to PartitionStates fails here, so
// that the per-state series of package metrics cannot miss it.
func TestPartitionStatesListsEveryState(t *testing.T) {
	src, err := os.ReadFile("stats.go")
	if err != nil {
		t.Fatal(err)
	}
	var declared []PartitionState
	for _, m := range regexp.MustCompile(`(?m)^\s*State\w+\s+PartitionState = "([^"]+)"`).FindAllStringSubmatch(string(src), -1) {
		declared = append(declared, PartitionState(m[1]))
	}
	if len(declared) == 0 {
		t.Fatal("found no PartitionState constant in stats.go")
	}
	listed := PartitionStates()
	if !slices.Equal(listed, declared) {
		t.Errorf("PartitionStates() = %q, want the constants of stats.go in their order %q", listed, declared)
	}
	listed[0] = "changed"
	if PartitionStates()[0] != StateReconciling {
		t.Error("PartitionStates returns a slice its caller can change for everyone")
	}
}
