package offsetstore

import (
	"cmp"
	"slices"
	"time"

	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

// The errors Open and Check wrap; test for them with errors.Is.
var (
	// ErrInUse: a consumer (or another process) holds the file.
	ErrInUse = offsetfile.ErrInUse
	// ErrSchema: not a tidemark offset file, or a schema this build does
	// not know.
	ErrSchema = offsetfile.ErrSchema
	// ErrDamaged: the file is damaged; Check says where.
	ErrDamaged = offsetfile.ErrDamaged
)

// File is an offset file opened read-only. Its methods are safe for
// concurrent use.
type File struct {
	s *offsetfile.Store
}

// Open opens the offset file at path read-only, with a shared lock: other
// readers may share it, a consumer may not open it until Close. It waits at
// most a second for the lock.
func Open(path string) (*File, error) {
	s, err := offsetfile.Open(path, &offsetfile.Options{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	return &File{s: s}, nil
}

// Close releases the file.
func (f *File) Close() error { return f.s.Close() }

// Path is the file's path.
func (f *File) Path() string { return f.s.Path() }

// Partition is what the file records for one partition of one group.
type Partition struct {
	Group     string
	Topic     string
	Partition int

	// Watermark is the next offset to handle: every offset below it is
	// done. -1 when none is recorded.
	Watermark int64
	// Completed are the offsets done above Watermark (a consumer that
	// completes out of order), sorted and disjoint.
	Completed []Range
	// RecordedAt is when Watermark was recorded.
	RecordedAt time.Time

	// Committed is the last offset the consumer saw Kafka confirm, and
	// CommittedAt when; -1 when none.
	Committed   int64
	CommittedAt time.Time

	// Skipped and DeadLettered count the messages the failure policy
	// skipped or wrote to a dead-letter topic, over the file's life.
	Skipped      int64
	DeadLettered int64
}

// Range is the offsets [From, To).
type Range struct {
	From, To int64
}

// Partitions lists every partition the file records, sorted by group,
// topic and partition.
func (f *File) Partitions() []Partition {
	entries := f.s.Records()
	out := make([]Partition, 0, len(entries))
	for _, e := range entries {
		r := e.Record
		p := Partition{
			Group: e.Group, Topic: e.Topic, Partition: int(e.Partition),
			Watermark: r.Watermark, RecordedAt: r.RecordedAt,
			Committed: r.Committed, CommittedAt: r.CommittedAt,
			Skipped: r.Skipped, DeadLettered: r.DeadLettered,
		}
		for _, rg := range r.Completed {
			p.Completed = append(p.Completed, Range{From: rg.From, To: rg.To})
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(a, b Partition) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return out
}

// Lookup returns what the file records for one partition; false when
// nothing.
func (f *File) Lookup(group, topic string, partition int) (Partition, bool) {
	for _, p := range f.Partitions() {
		if p.Group == group && p.Topic == topic && p.Partition == partition {
			return p, true
		}
	}
	return Partition{}, false
}

// The limits of a TxHandler's state (handler.State): a key is 1 to
// MaxStateKey bytes, a value at most MaxStateValue.
const (
	MaxStateKey   = offsetfile.MaxStateKey
	MaxStateValue = offsetfile.MaxStateValue
)

// ViewState calls fn with a read-only view of one partition's state (a
// TxHandler's), as the file holds it; the view's Put and Delete fail. It is
// Consumer.ViewState for a stopped consumer.
func (f *File) ViewState(group, topic string, partition int, fn func(handler.State) error) error {
	k := offsetfile.Key{Group: group, Topic: topic, Partition: int32(partition)}
	return f.s.ViewState(k, func(st *offsetfile.StateTx) error { return fn(st) })
}
