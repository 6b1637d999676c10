package main

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
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
//
// A partition's state (a TxHandler's), with its changelog side, comes
// last, and only when it has one, for the same reason: changelog_position
// (where the partition's changelog stands for this file),
// changelog_outbox (the changes the changelog has not acknowledged yet:
// they are in the state, and must still reach the changelog) and
// state_entries [{"key": K, "value": V}...] in key order, keys and values
// in base64. The state is only consistent with the watermark it was
// written with, so it travels with its record; the position, like the
// watermark, makes sense for the same topics only.
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
	// CompletedRanges and the state are last: they may be long.
	CompletedRanges   []rangeDoc      `json:"completed_ranges,omitempty"`
	ChangelogPosition *positionDoc    `json:"changelog_position,omitempty"`
	ChangelogOutbox   []outboxDoc     `json:"changelog_outbox,omitempty"`
	StateEntries      []stateEntryDoc `json:"state_entries,omitempty"`
}

// stateEntryDoc is a state entry. Keys and values are bytes, carried as
// base64 (standard, padded: what encoding/json makes of a []byte) in
// strings, which import decodes itself so that a bad one is named with its
// partition and key.
type stateEntryDoc struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// positionDoc is an offsetfile.ChangelogPosition.
type positionDoc struct {
	Epoch   int64       `json:"epoch"`
	Start   int64       `json:"start"`
	Next    int64       `json:"next"`
	Acked   int64       `json:"acked"`
	Gap     bool        `json:"gap"`
	Markers []markerDoc `json:"markers,omitempty"`
}

type markerDoc struct {
	Epoch int64 `json:"epoch"`
	Start int64 `json:"start"`
}

// outboxDoc is an offsetfile.OutboxEntry; key and value in base64, as a
// state entry's.
type outboxDoc struct {
	Seq    uint64 `json:"seq"`
	Offset int64  `json:"offset"`
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Delete bool   `json:"delete,omitempty"`
}

func toPositionDoc(p *offsetfile.ChangelogPosition) *positionDoc {
	if p == nil {
		return nil
	}
	d := &positionDoc{Epoch: p.Epoch, Start: p.Start, Next: p.Next, Acked: p.Acked, Gap: p.Gap}
	for _, m := range p.Markers {
		d.Markers = append(d.Markers, markerDoc(m))
	}
	return d
}

func fromPositionDoc(d *positionDoc) *offsetfile.ChangelogPosition {
	if d == nil {
		return nil
	}
	p := &offsetfile.ChangelogPosition{Epoch: d.Epoch, Start: d.Start, Next: d.Next, Acked: d.Acked, Gap: d.Gap}
	for _, m := range d.Markers {
		p.Markers = append(p.Markers, offsetfile.ChangelogMarker(m))
	}
	return p
}

// withState adds a partition's state to its document.
func (d *partitionDoc) withState(st *offsetfile.StateDump) {
	if st.Empty() {
		return
	}
	enc := base64.StdEncoding.EncodeToString
	for _, e := range st.Entries {
		d.StateEntries = append(d.StateEntries, stateEntryDoc{Key: enc(e.Key), Value: enc(e.Value)})
	}
	d.ChangelogPosition = toPositionDoc(st.Changelog)
	for _, e := range st.Outbox {
		d.ChangelogOutbox = append(d.ChangelogOutbox, outboxDoc{Seq: e.Seq, Offset: e.Offset, Key: enc(e.Key), Value: enc(e.Value), Delete: e.Delete})
	}
}

// stateOf decodes the state d lists for the partition where names: nil
// when it lists none. The store checks the rest (limits, duplicates) when
// the state is put.
func stateOf(where string, d *partitionDoc) (*offsetfile.StateDump, error) {
	if len(d.StateEntries) == 0 && d.ChangelogPosition == nil && len(d.ChangelogOutbox) == 0 {
		return nil, nil
	}
	dec := base64.StdEncoding.DecodeString
	st := &offsetfile.StateDump{Changelog: fromPositionDoc(d.ChangelogPosition)}
	for i, e := range d.StateEntries {
		key, err := dec(e.Key)
		if err != nil {
			return nil, fmt.Errorf("%s: state entry %d: key %s: not base64: %v", where, i, quoteKey([]byte(e.Key)), err)
		}
		value, err := dec(e.Value)
		if err != nil {
			return nil, fmt.Errorf("%s: state key %s: value: not base64: %v", where, quoteKey(key), err)
		}
		st.Entries = append(st.Entries, offsetfile.StateEntry{Key: key, Value: value})
	}
	for _, e := range d.ChangelogOutbox {
		key, err := dec(e.Key)
		if err != nil {
			return nil, fmt.Errorf("%s: changelog outbox entry %d: key %s: not base64: %v", where, e.Seq, quoteKey([]byte(e.Key)), err)
		}
		value, err := dec(e.Value)
		if err != nil {
			return nil, fmt.Errorf("%s: changelog outbox entry %d, key %s: value: not base64: %v", where, e.Seq, quoteKey(key), err)
		}
		st.Outbox = append(st.Outbox, offsetfile.OutboxEntry{Seq: e.Seq, Offset: e.Offset, Key: key, Value: value, Delete: e.Delete})
	}
	return st, nil
}

// quoteKey quotes a state key for a message, cut short: a key may be up
// to 4 KiB of anything.
func quoteKey(k []byte) string {
	const max = 64
	if len(k) > max {
		return strconv.Quote(string(k[:max])) + "..."
	}
	return strconv.Quote(string(k))
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

// toOffsetsDoc groups the entries (sorted by key) by group and topic, with
// their failure entries and states.
func toOffsetsDoc(entries []offsetfile.Entry, failures map[offsetfile.Key][]offsetfile.Failure, states map[offsetfile.Key]*offsetfile.StateDump) offsetsDoc {
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
		d := toPartitionDoc(e, failures[e.Key])
		d.withState(states[e.Key])
		t.Partitions = append(t.Partitions, d)
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
	// state is the partition's state; nil when the input lists none.
	state *offsetfile.StateDump
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
				st, err := stateOf(where, &p)
				if err != nil {
					return nil, err
				}
				im.state = st
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
