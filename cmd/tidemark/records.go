package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

// The export format, also used for the records in inspect --json:
//
//	{"format": "tidemark-offsets", "version": 1, "groups": [
//	  {"group": G, "topics": [{"topic": T, "partitions": [partitionDoc...]}]}]}
//
// Every field of an offsetfile.Record is there; times are RFC 3339 in UTC
// with nanoseconds and left out when zero; offsets are Kafka-style "next
// offset" positions, -1 meaning none. completed_ranges, the offsets
// completed above the watermark as [from, to) pairs [[from, to], ...], is
// left out when there are none: a file without ranges exports as before
// they existed, and an older build refuses a document with them (unknown
// field) rather than drop them.
const (
	offsetsFormat  = "tidemark-offsets"
	offsetsVersion = 1
)

type offsetsDoc struct {
	Format     string     `json:"format"`
	Version    int        `json:"version"`
	Source     string     `json:"source,omitempty"`
	ExportedAt time.Time  `json:"exported_at,omitzero"`
	Groups     []groupDoc `json:"groups"`
}

type groupDoc struct {
	Group  string     `json:"group"`
	Topics []topicDoc `json:"topics"`
}

type topicDoc struct {
	Topic      string         `json:"topic"`
	Partitions []partitionDoc `json:"partitions"`
}

type partitionDoc struct {
	Partition    int32        `json:"partition"`
	Watermark    int64        `json:"watermark"`
	RecordedAt   time.Time    `json:"recorded_at,omitzero"`
	Generation   int32        `json:"generation"`
	Member       string       `json:"member"`
	Committed    int64        `json:"committed"`
	CommittedAt  time.Time    `json:"committed_at,omitzero"`
	LastReset    *resetDoc    `json:"last_reset,omitempty"`
	Run          *runDoc      `json:"run,omitempty"`
	Skipped      int64        `json:"skipped"`
	DeadLettered int64        `json:"dead_lettered"`
	LastCommit   *commitDoc   `json:"last_commit,omitempty"`
	Failures     []failureDoc `json:"failures,omitempty"`
	// CompletedRanges is last: it may be long.
	CompletedRanges []rangeDoc `json:"completed_ranges,omitempty"`
}

// rangeDoc is an offsetfile.Range as the JSON array [from, to].
type rangeDoc [2]int64

// UnmarshalJSON takes exactly two offsets (encoding/json would fill a
// shorter array with zeros and drop the rest of a longer one).
func (r *rangeDoc) UnmarshalJSON(b []byte) error {
	var a []int64
	if err := json.Unmarshal(b, &a); err != nil {
		return fmt.Errorf("completed range: %w", err)
	}
	if len(a) != 2 {
		return fmt.Errorf("completed range %s: want [from, to]", b)
	}
	*r = rangeDoc{a[0], a[1]}
	return nil
}

type resetDoc struct {
	At     time.Time `json:"at,omitzero"`
	From   int64     `json:"from"`
	To     int64     `json:"to"`
	Reason string    `json:"reason"`
}

type runDoc struct {
	Open     bool  `json:"open"`
	Inflight int64 `json:"inflight"`
	Crashes  int32 `json:"crashes"`
}

type commitDoc struct {
	Offset     int64     `json:"offset"`
	Generation int32     `json:"generation"`
	At         time.Time `json:"at,omitzero"`
	Outcome    string    `json:"outcome"` // ok, fenced, error, unknown
	LatencyNs  int64     `json:"latency_ns"`
	Error      string    `json:"error,omitempty"`
}

type failureDoc struct {
	Offset     int64     `json:"offset"`
	At         time.Time `json:"at,omitzero"`
	Action     string    `json:"action"` // skipped, dead-lettered
	Attempts   int32     `json:"attempts"`
	Reason     string    `json:"reason"`
	DeadLetter string    `json:"dead_letter,omitempty"`
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return t.UTC()
}

func toPartitionDoc(e offsetfile.Entry, failures []offsetfile.Failure) partitionDoc {
	r := e.Record
	d := partitionDoc{
		Partition: e.Partition, Watermark: r.Watermark, RecordedAt: utc(r.RecordedAt),
		Generation: r.Generation, Member: r.Member, Committed: r.Committed, CommittedAt: utc(r.CommittedAt),
		Skipped: r.Skipped, DeadLettered: r.DeadLettered,
	}
	if rs := r.LastReset; rs != nil {
		d.LastReset = &resetDoc{At: utc(rs.At), From: rs.From, To: rs.To, Reason: rs.Reason}
	}
	if run := r.Run; run != nil {
		d.Run = &runDoc{Open: run.Open, Inflight: run.Inflight, Crashes: run.Crashes}
	}
	if c := r.LastCommit; c != nil {
		d.LastCommit = &commitDoc{Offset: c.Offset, Generation: c.Generation, At: utc(c.At), Outcome: c.Outcome.String(),
			LatencyNs: int64(c.Latency), Error: c.Error}
	}
	for _, rg := range r.Completed {
		d.CompletedRanges = append(d.CompletedRanges, rangeDoc{rg.From, rg.To})
	}
	for _, f := range failures {
		d.Failures = append(d.Failures, failureDoc{Offset: f.Offset, At: utc(f.At), Action: actionName(f.Action),
			Attempts: f.Attempts, Reason: f.Reason, DeadLetter: f.DeadLetter})
	}
	return d
}

// toOffsetsDoc groups the entries (sorted by key) by group and topic.
func toOffsetsDoc(entries []offsetfile.Entry, failures map[offsetfile.Key][]offsetfile.Failure) offsetsDoc {
	doc := offsetsDoc{Format: offsetsFormat, Version: offsetsVersion, Groups: []groupDoc{}}
	for _, e := range entries {
		if n := len(doc.Groups); n == 0 || doc.Groups[n-1].Group != e.Group {
			doc.Groups = append(doc.Groups, groupDoc{Group: e.Group})
		}
		g := &doc.Groups[len(doc.Groups)-1]
		if n := len(g.Topics); n == 0 || g.Topics[n-1].Topic != e.Topic {
			g.Topics = append(g.Topics, topicDoc{Topic: e.Topic})
		}
		t := &g.Topics[len(g.Topics)-1]
		t.Partitions = append(t.Partitions, toPartitionDoc(e, failures[e.Key]))
	}
	return doc
}

var outcomes = map[string]offsetfile.CommitOutcome{
	"ok": offsetfile.CommitOK, "fenced": offsetfile.CommitFenced,
	"error": offsetfile.CommitError, "unknown": offsetfile.CommitUnknown,
}

// actionName is a failure's action as export and inspect show it, the
// snapshot's name: "skipped" or "dead-lettered".
func actionName(a offsetfile.FailureAction) string {
	if s, err := inspect.ActionName(a); err == nil {
		return s
	}
	return a.String() // never recorded: the file's check names it
}

// imported is one partition of an import document.
type imported struct {
	key      offsetfile.Key
	rec      offsetfile.Record
	failures []offsetfile.Failure
}

// fromOffsetsDoc checks the document's format and turns it into records,
// sorted by key. Values are validated by the store when they are put.
func fromOffsetsDoc(doc *offsetsDoc) ([]imported, error) {
	if doc.Format != offsetsFormat {
		return nil, fmt.Errorf("format %q, want %q", doc.Format, offsetsFormat)
	}
	if doc.Version != offsetsVersion {
		return nil, fmt.Errorf("format version %d, this build reads version %d", doc.Version, offsetsVersion)
	}
	var out []imported
	seen := map[offsetfile.Key]bool{}
	for _, g := range doc.Groups {
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				k := offsetfile.Key{Group: g.Group, Topic: t.Topic, Partition: p.Partition}
				where := fmt.Sprintf("group %q topic %q partition %d", k.Group, k.Topic, k.Partition)
				if seen[k] {
					return nil, fmt.Errorf("%s is listed twice", where)
				}
				seen[k] = true
				im := imported{key: k, rec: offsetfile.Record{
					Watermark: p.Watermark, RecordedAt: p.RecordedAt, Generation: p.Generation, Member: p.Member,
					Committed: p.Committed, CommittedAt: p.CommittedAt, Skipped: p.Skipped, DeadLettered: p.DeadLettered,
				}}
				for _, rg := range p.CompletedRanges {
					im.rec.Completed = append(im.rec.Completed, offsetfile.Range{From: rg[0], To: rg[1]})
				}
				if rs := p.LastReset; rs != nil {
					im.rec.LastReset = &offsetfile.Reset{At: rs.At, From: rs.From, To: rs.To, Reason: rs.Reason}
				}
				if run := p.Run; run != nil {
					im.rec.Run = &offsetfile.RunState{Open: run.Open, Inflight: run.Inflight, Crashes: run.Crashes}
				}
				if c := p.LastCommit; c != nil {
					o, ok := outcomes[c.Outcome]
					if !ok {
						return nil, fmt.Errorf("%s: last commit outcome %q: want ok, fenced, error or unknown", where, c.Outcome)
					}
					im.rec.LastCommit = &offsetfile.CommitAttempt{Offset: c.Offset, Generation: c.Generation, At: c.At,
						Outcome: o, Latency: time.Duration(c.LatencyNs), Error: c.Error}
				}
				offs := map[int64]bool{}
				for _, f := range p.Failures {
					a, err := inspect.ParseAction(f.Action)
					if err != nil {
						return nil, fmt.Errorf("%s: failure at offset %d: action %q: want skipped or dead-lettered", where, f.Offset, f.Action)
					}
					if offs[f.Offset] {
						return nil, fmt.Errorf("%s: failure at offset %d is listed twice", where, f.Offset)
					}
					offs[f.Offset] = true
					if f.At.IsZero() {
						return nil, fmt.Errorf("%s: failure at offset %d has no time", where, f.Offset)
					}
					im.failures = append(im.failures, offstoreFailure(f, a))
				}
				out = append(out, im)
			}
		}
	}
	slices.SortFunc(out, func(a, b imported) int { return compareKeys(a.key, b.key) })
	return out, nil
}

func offstoreFailure(f failureDoc, a offsetfile.FailureAction) offsetfile.Failure {
	return offsetfile.Failure{Offset: f.Offset, At: f.At, Action: a, Attempts: f.Attempts, Reason: f.Reason, DeadLetter: f.DeadLetter}
}

// completedSummary describes a record's completed ranges, for inspect: the
// offsets completed above the watermark, in how many ranges, and the
// highest; "" if none.
func completedSummary(r offsetfile.Record) string {
	if len(r.Completed) == 0 {
		return ""
	}
	return "completed above watermark: " + completedCounts(r)
}

// completedCounts is "1,234 offsets in 3 ranges, up to 5678".
func completedCounts(r offsetfile.Record) string {
	return fmt.Sprintf("%s in %s, up to %d",
		plural(completedOffsets(r), "offset"), plural(int64(len(r.Completed)), "range"), r.Completed[len(r.Completed)-1].To-1)
}

// plural formats n things: "1 range", "1,234 ranges".
func plural(n int64, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return inspect.FormatCount(n) + " " + thing + "s"
}

// completedOffsets counts the offsets in r.Completed. They are disjoint
// offsets of one partition, so the sum fits in an int64.
func completedOffsets(r offsetfile.Record) int64 {
	var n int64
	for _, rg := range r.Completed {
		n += rg.To - rg.From
	}
	return n
}

func compareKeys(a, b offsetfile.Key) int {
	return cmp.Or(strings.Compare(a.Group, b.Group), strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
}
