package framework

import (
	"fmt"
	"strings"
	"testing"
)

// A commit of many partitions goes in requests Kafka's coordinator can
// write as one batch each (Kafka 4.4.0 refused a commit of 10,000
// partitions whole: "larger than the maximum batch size of 1048588 bytes").
func TestCommitChunks(t *testing.T) {
	var todo []*partition
	meta := map[topicPartition]string{}
	for i := range 10_000 {
		p := &partition{tp: topicPartition{fmt.Sprintf("orders-%d", i%3), int32(i)}}
		if i%100 == 0 {
			meta[p.tp] = strings.Repeat("r", 1000) // completed ranges carried
		}
		todo = append(todo, p)
	}
	group := strings.Repeat("g", 200)
	chunks := commitChunks(group, todo, meta, maxCommitBytes)
	seen := 0
	for i, c := range chunks {
		size := 0
		for _, p := range c {
			if p != todo[seen] {
				t.Fatalf("chunk %d: partitions out of order or missing at %d", i, seen)
			}
			seen++
			size += commitBytes(group, p.tp.topic, meta[p.tp])
		}
		if len(c) == 0 || (size > maxCommitBytes && len(c) > 1) {
			t.Fatalf("chunk %d: %d partitions, %d bytes (limit %d)", i, len(c), size, maxCommitBytes)
		}
	}
	if seen != len(todo) || len(chunks) < 2 {
		t.Fatalf("%d chunks holding %d of %d partitions", len(chunks), seen, len(todo))
	}
	if c := commitChunks("g", todo[:5], nil, maxCommitBytes); len(c) != 1 || len(c[0]) != 5 {
		t.Fatalf("5 partitions: %d chunks", len(c))
	}
	// One partition larger than the limit still goes, alone.
	big := map[topicPartition]string{todo[1].tp: strings.Repeat("x", maxCommitBytes)}
	if c := commitChunks("g", todo[:3], big, maxCommitBytes); len(c) != 3 {
		t.Fatalf("a partition over the limit: %d chunks, want 3 (it alone)", len(c))
	}
	t.Logf("10,000 partitions, group of 200 bytes: %d requests", len(chunks))
}
