package testsupport

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/handler"
)

// Offset is a position in a partition, written "partition@offset".
type Offset struct {
	Partition int
	Offset    int64
}

func (o Offset) String() string { return fmt.Sprintf("%d@%d", o.Partition, o.Offset) }

// Handled says how many times each offset of one topic was handled.
// Recorder, its Topic views, Ledger and HandledFunc implement it.
type Handled interface {
	Times(partition int, offset int64) int
}

// HandledFunc adapts a function to Handled, for a test that counts some
// offsets its own way (say, the ones a failure policy skipped).
type HandledFunc func(partition int, offset int64) int

// Times returns f(partition, offset).
func (f HandledFunc) Times(partition int, offset int64) int { return f(partition, offset) }

// Recorder is a Handler that counts how often each offset of each topic
// was handled and checks each message's payload. The zero Recorder is
// ready to use; set its fields before the consumer calls it.
type Recorder struct {
	// Before, if set, runs before a message is recorded; an error from it
	// is returned without recording.
	Before func(ctx context.Context, m kafka.Message) error
	// Want is the payload expected at an offset; nil means Value(partition,
	// offset), what Cluster.Produce and ValueRecords write. A message with
	// another payload is recorded all the same, and listed by BadValues.
	Want func(partition int, offset int64) []byte
	// AnyValue turns the payload check off.
	AnyValue bool

	mu   sync.Mutex
	seen map[string]map[int]map[int64]int // topic -> partition -> offset -> times
	bad  []string
}

var _ handler.Handler = (*Recorder)(nil)

// Handle runs Before, then records m.
func (r *Recorder) Handle(ctx context.Context, m kafka.Message) error {
	if r.Before != nil {
		if err := r.Before(ctx, m); err != nil {
			return err
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.AnyValue {
		want := Value(m.Partition, int(m.Offset))
		if r.Want != nil {
			want = r.Want(m.Partition, m.Offset)
		}
		if !bytes.Equal(m.Value, want) {
			r.bad = append(r.bad, fmt.Sprintf("%s/%d@%d: value %.40q, want %.40q", m.Topic, m.Partition, m.Offset, m.Value, want))
		}
	}
	if r.seen == nil {
		r.seen = map[string]map[int]map[int64]int{}
	}
	byPart := r.seen[m.Topic]
	if byPart == nil {
		byPart = map[int]map[int64]int{}
		r.seen[m.Topic] = byPart
	}
	if byPart[m.Partition] == nil {
		byPart[m.Partition] = map[int64]int{}
	}
	byPart[m.Partition][m.Offset]++
	return nil
}

// Count is the number of distinct offsets handled, of every topic.
func (r *Recorder) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, byPart := range r.seen {
		for _, offs := range byPart {
			n += len(offs)
		}
	}
	return n
}

// CountOf is the number of distinct offsets of topic handled.
func (r *Recorder) CountOf(topic string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, offs := range r.seen[topic] {
		n += len(offs)
	}
	return n
}

// Times is how many times offset of partition was handled, in every topic:
// for a consumer of one topic.
func (r *Recorder) Times(partition int, offset int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, byPart := range r.seen {
		n += byPart[partition][offset]
	}
	return n
}

// Topic is what r handled of topic alone.
func (r *Recorder) Topic(topic string) Handled {
	return HandledFunc(func(partition int, offset int64) int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.seen[topic][partition][offset]
	})
}

// BadValues lists the messages whose payload was not the one expected.
func (r *Recorder) BadValues() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.bad...)
}

// Delivery is what Check found in a range of offsets.
type Delivery struct {
	// Offsets is the number of offsets checked.
	Offsets int
	// Lost are the offsets never handled, Twice those handled more than
	// once, each in partition and offset order.
	Lost, Twice []Offset
	// Extra counts the handlings beyond the first of every offset.
	Extra int

	describe func(Offset) string
}

// Describer is implemented by a Handled that can say more about an offset
// handled more than once (which members handled it, say); the failure
// messages of ExactlyOnce and NoneLost then include it.
type Describer interface {
	Describe(o Offset) string
}

// Check counts, in each partition p of to, the offsets in [from[p], to[p])
// (from[p] is 0 when missing) that h never handled, and those it handled
// more than once.
func Check(h Handled, from, to map[int]int64) Delivery {
	d := Delivery{}
	if dh, ok := h.(Describer); ok {
		d.describe = dh.Describe
	}
	parts := make([]int, 0, len(to))
	for p := range to {
		parts = append(parts, p)
	}
	sort.Ints(parts)
	for _, p := range parts {
		for o := from[p]; o < to[p]; o++ {
			d.Offsets++
			switch n := h.Times(p, o); {
			case n == 0:
				d.Lost = append(d.Lost, Offset{p, o})
			case n > 1:
				d.Twice = append(d.Twice, Offset{p, o})
				d.Extra += n - 1
			}
		}
	}
	return d
}

// String says what was lost and handled twice, naming the first of each.
func (d Delivery) String() string {
	return fmt.Sprintf("%d of %d offsets lost%s; %d handled more than once (%d extra handlings)%s",
		len(d.Lost), d.Offsets, first(d.Lost, nil), len(d.Twice), d.Extra, first(d.Twice, d.describe))
}

// first names the first ten offsets of offs, each described by describe if
// set.
func first(offs []Offset, describe func(Offset) string) string {
	if len(offs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(", first ")
	for i, o := range offs[:min(len(offs), 10)] {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(o.String())
		if describe != nil {
			fmt.Fprintf(&b, " (%s)", describe(o))
		}
	}
	if len(offs) > 10 {
		b.WriteString(", ...")
	}
	return b.String()
}

// ExactlyOnce fails the test (t.Fatalf) unless h handled every offset in
// [from[p], to[p]) of each partition p of to exactly once; the message
// counts what was lost and handled twice and names the first of each. It
// returns what it found, for the test's log.
func ExactlyOnce(t testing.TB, h Handled, from, to map[int]int64) Delivery {
	t.Helper()
	d := Check(h, from, to)
	if len(d.Lost) > 0 || len(d.Twice) > 0 {
		t.Fatalf("not exactly once in %s: %s", span(from, to), d)
	}
	return d
}

// NoneLost is ExactlyOnce for a test in which an offset may be handled
// more than once (after a SIGKILL, say): it fails the test only for what
// was lost, and returns what it found, duplicates included, for the test
// to bound or log.
func NoneLost(t testing.TB, h Handled, from, to map[int]int64) Delivery {
	t.Helper()
	d := Check(h, from, to)
	if len(d.Lost) > 0 {
		t.Fatalf("lost in %s: %s", span(from, to), d)
	}
	return d
}

// span describes the range of a check: "[0, 100) of partitions 0-3", or
// per partition where they differ.
func span(from, to map[int]int64) string {
	parts := make([]int, 0, len(to))
	for p := range to {
		parts = append(parts, p)
	}
	sort.Ints(parts)
	if len(parts) == 0 {
		return "no partition"
	}
	same := true
	for _, p := range parts {
		same = same && from[p] == from[parts[0]] && to[p] == to[parts[0]]
	}
	if same {
		return fmt.Sprintf("[%d, %d) of partitions %v", from[parts[0]], to[parts[0]], parts)
	}
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%d: [%d, %d)", p, from[p], to[p])
	}
	return b.String()
}

// Offsets builds a partition -> offset map of partitions 0..partitions-1
// with the same offset everywhere.
func Offsets(partitions int, offset int64) map[int]int64 {
	m := make(map[int]int64, partitions)
	for p := 0; p < partitions; p++ {
		m[p] = offset
	}
	return m
}

// EqualOffsets reports whether two partition -> offset maps are equal.
func EqualOffsets(a, b map[int]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
