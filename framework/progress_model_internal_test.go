package framework

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"pgregory.net/rapid"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// The progress bookkeeping as a whole (tracker, progress marker, offset
// file) against a plain model of which offsets are done. rapid draws a
// log (records, and offsets that are no record: compacted away, control
// batches, aborted records) and random histories over it: fetches, Handler
// completions in any order, skips recorded as failures, flushes, resets,
// graceful restarts and crashes at any point. It checks that:
//   - the file never claims an offset done that is a record no run completed
//     (a loss);
//   - after a graceful restart no completed offset is handed out again;
//   - after a crash, none the file had made durable is;
//   - a flush records every completion made before it.
//
// A history it finds failing is shrunk to a short one; such histories
// become named regression tests below (TestProgressModelRegressions).
func TestProgressModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := newProgressModel(rt, t.TempDir())
		defer m.close()
		rt.Repeat(map[string]func(*rapid.T){
			"fetch":    m.fetch,
			"complete": m.complete,
			"skip":     m.skip,
			"flush":    m.flush,
			"restart":  m.restart,
			"crash":    m.crash,
			"reset":    m.reset,
			"":         m.check,
		})
	})
}

// A record is an offset a fetch returns; other offsets of the log are no
// record (a gap or a control batch) and a fetch passes them by advancing.
type progressModel struct {
	t    *rapid.T
	dir  string
	path string
	key  offsetfile.Key
	log  []bool // log[o]: offset o is a record

	store  *offsetfile.Store
	tr     *tracker
	mark   *offsetfile.Marker
	closed bool // mark is closed
	proc   atomic.Int64
	logs   *observer.ObservedLogs

	cursor   int64          // the next offset to fetch
	inFlight []int64        // dispatched in this run, not yet done
	done     map[int64]bool // completed or skipped, in any run
	runDone  map[int64]bool // completed in this run, or proven done when it began
	handed   map[int64]int  // times handed to a Handler call, all runs
	durable  []byte         // the file's bytes after the last flush
	proven   map[int64]bool // offsets the file claimed done at the last flush
	noRepeat map[int64]bool // offsets this run must not hand out
}

var modelFiles atomic.Int64

func newProgressModel(t *rapid.T, dir string) *progressModel {
	n := rapid.IntRange(1, 80).Draw(t, "log size")
	m := &progressModel{t: t, dir: dir, key: offsetfile.Key{Group: "g", Topic: "t", Partition: 0},
		done: map[int64]bool{}, runDone: map[int64]bool{}, handed: map[int64]int{}, proven: map[int64]bool{}, noRepeat: map[int64]bool{}}
	m.path = filepath.Join(dir, fmt.Sprintf("model-%d.db", modelFiles.Add(1)))
	for range n {
		m.log = append(m.log, rapid.IntRange(0, 9).Draw(t, "kind") < 7)
	}
	m.open()
	m.begin(0, nil)
	return m
}

func (m *progressModel) open() {
	core, logs := observer.New(zapcore.ErrorLevel)
	s, err := offsetfile.Open(m.path, &offsetfile.Options{NoSync: true, Logger: zap.New(core)})
	if err != nil {
		m.t.Fatalf("open: %v", err)
	}
	m.store, m.logs = s, logs
}

// begin starts a run at start with the ranges the file records above it,
// as reconciliation does when the file is current.
func (m *progressModel) begin(start int64, restored []offsetfile.Range) {
	m.tr = newTracker(start, restored, &m.proc)
	mk, err := m.store.NewProgressMarker(m.key, 1, "member", m.tr.progress)
	if err != nil {
		m.t.Fatalf("marker: %v", err)
	}
	m.mark, m.closed, m.cursor, m.inFlight = mk, false, start, nil
}

// fetch returns the next batch of the log, as the partition's goroutine
// sees it: each record skipped or dispatched, then advance past the batch.
func (m *progressModel) fetch(t *rapid.T) {
	if m.cursor >= int64(len(m.log)) {
		t.Skip("log end")
	}
	k := rapid.Int64Range(1, 8).Draw(t, "batch")
	end := min(m.cursor+k, int64(len(m.log)))
	for o := m.cursor; o < end; o++ {
		if !m.log[o] || m.tr.skip(o) {
			continue
		}
		if m.noRepeat[o] {
			t.Fatalf("offset %d handed out again, though it was done and the file knew it", o)
		}
		m.tr.begin(o, 0, 0)
		m.handed[o]++
		m.inFlight = append(m.inFlight, o)
	}
	m.tr.advance(end)
	m.mark.Changed()
	m.cursor = end
}

func (m *progressModel) finish(t *rapid.T) int64 {
	if len(m.inFlight) == 0 {
		t.Skip("nothing in flight")
	}
	i := rapid.IntRange(0, len(m.inFlight)-1).Draw(t, "which")
	o := m.inFlight[i]
	m.inFlight = slices.Delete(m.inFlight, i, i+1)
	m.done[o], m.runDone[o] = true, true
	return o
}

func (m *progressModel) complete(t *rapid.T) {
	o := m.finish(t)
	m.tr.complete(o)
	m.mark.Changed()
}

// skip is the failure policy giving a message up: recorded, then done.
func (m *progressModel) skip(t *rapid.T) {
	o := m.finish(t)
	if err := m.store.RecordFailure(m.key, offsetfile.Failure{Offset: o, Action: offsetfile.FailureSkip, Attempts: 1, Reason: "model"}); err != nil {
		t.Fatalf("record failure: %v", err)
	}
	m.tr.complete(o)
	m.mark.Changed()
}

// flush makes the progress durable and checks what the file claims.
func (m *progressModel) flush(t *rapid.T) {
	if err := m.store.Flush(context.Background()); err != nil {
		t.Fatalf("flush: %v", err)
	}
	b, err := os.ReadFile(m.path)
	if err != nil {
		t.Fatal(err)
	}
	m.durable = b
	claim := m.claimed()
	for o := range claim {
		if o >= int64(len(m.log)) {
			t.Fatalf("the file claims offset %d done, past the log end %d", o, len(m.log))
		}
		if m.log[o] && !m.done[o] {
			t.Fatalf("the file claims offset %d done, which no run completed: a loss (record %+v)", o, m.record())
		}
	}
	for o := range m.runDone {
		if !claim[o] && m.log[o] {
			t.Fatalf("offset %d was done before the flush but the file does not claim it (record %+v)", o, m.record())
		}
	}
	m.proven = claim
	if _, ok := m.store.Durable(m.key); !ok || m.closed {
		return // no record yet, or the Marker is closed (restart)
	}
	if got, want := m.mark.DurableDone(), int64(len(claim)); got != want {
		t.Fatalf("DurableDone %d, want %d, the offsets the durable record proves done", got, want)
	}
}

func (m *progressModel) record() offsetfile.Record {
	rec, _ := m.store.Durable(m.key)
	return rec
}

// claimed is the set of offsets the durable record says are done: below
// the watermark (within the log) and in its completed ranges.
func (m *progressModel) claimed() map[int64]bool {
	rec := m.record()
	out := map[int64]bool{}
	for o := int64(0); o < rec.Watermark; o++ {
		out[o] = true
	}
	for _, r := range rec.Completed {
		for o := r.From; o < r.To; o++ {
			out[o] = true
		}
	}
	return out
}

// restart is a graceful stop and start: the calls in flight are cancelled
// (their messages not done), the progress flushed, the file closed and
// opened again; nothing completed may be handed out again.
func (m *progressModel) restart(t *rapid.T) {
	m.mark.Close()
	m.closed = true
	m.flush(t)
	m.reopen(t)
	m.noRepeat = maps.Clone(m.runDone)
	m.runDone = maps.Clone(m.proven)
}

// crash ends the process at once: the file is what the last flush made it.
func (m *progressModel) crash(t *rapid.T) {
	m.mark.Close()
	if err := m.store.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	m.store = nil
	if m.durable == nil {
		_ = os.Remove(m.path)
	} else if err := os.WriteFile(m.path, m.durable, 0o600); err != nil {
		t.Fatal(err)
	}
	m.reopen(t)
	m.noRepeat = maps.Clone(m.proven)
	m.runDone = maps.Clone(m.proven)
}

func (m *progressModel) reopen(t *rapid.T) {
	if m.store != nil {
		if err := m.store.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
	}
	m.open()
	rec, ok := m.store.Durable(m.key)
	if !ok || rec.Watermark < 0 {
		m.begin(0, nil)
		return
	}
	m.begin(rec.Watermark, rec.Completed)
}

// reset is the OutOfRange policy moving a partition with nothing in a call
// to a later offset: the log's start moved past it (retention), so the
// offsets below are gone, no record any more.
func (m *progressModel) reset(t *rapid.T) {
	if len(m.inFlight) > 0 {
		t.Skip("a call in flight")
	}
	wm := m.tr.watermark()
	if wm >= int64(len(m.log)) {
		t.Skip("at the log end")
	}
	to := rapid.Int64Range(wm+1, int64(len(m.log))).Draw(t, "to")
	for o := int64(0); o < to; o++ {
		m.log[o] = false
	}
	if err := m.store.RecordReset(m.key, offsetfile.Reset{From: wm, To: to, Reason: "model"}); err != nil {
		t.Fatalf("record reset: %v", err)
	}
	m.tr.reset(to)
	m.mark.Changed()
	m.cursor = to
	// A reset forgets what was done above its target, by design: the
	// partition handles again from there (docs/guarantees.md).
	m.runDone, m.noRepeat = map[int64]bool{}, map[int64]bool{}
}

// check runs after every step: the invariants of the tracker itself.
func (m *progressModel) check(t *rapid.T) {
	wm, ranges := m.tr.progress()
	for o := range wm {
		if o < int64(len(m.log)) && m.log[o] && !m.done[o] {
			t.Fatalf("watermark %d passes offset %d, a record not done", wm, o)
		}
	}
	if err := validRanges(wm, ranges); err != nil {
		t.Fatalf("progress (%d, %v): %v", wm, ranges, err)
	}
	// MaxUndurable's measure: what progress proves done, and the calls.
	done := wm
	for _, r := range ranges {
		done += r.To - r.From
	}
	if got, want := m.tr.reach(), done+int64(len(m.inFlight)); got != want {
		t.Fatalf("reach %d, want %d: progress (%d, %v) and %d in flight", got, want, wm, ranges, len(m.inFlight))
	}
	if e := m.logs.All(); len(e) > 0 {
		t.Fatalf("the offset file logged an error: %s %v", e[0].Message, e[0].ContextMap())
	}
}

// validRanges checks Record.Completed's rules: sorted, disjoint, not
// touching, above the watermark.
func validRanges(wm int64, rs []offsetfile.Range) error {
	prev := wm
	for i, r := range rs {
		if r.From >= r.To || r.From <= prev || (i > 0 && r.From == rs[i-1].To) {
			return fmt.Errorf("range %d [%d, %d) after %d", i, r.From, r.To, prev)
		}
		prev = r.To
	}
	return nil
}

func (m *progressModel) close() {
	if m.store != nil {
		m.mark.Close()
		_ = m.store.Close()
	}
}
