package offsetfile_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// The journal model test: a child process applies a random history of
// updates, Flushes and Syncs to a store with a journal, acknowledging each
// Flush and Sync on its standard output; the test SIGKILLs it at a random
// moment, sometimes cuts the journal as a crash of the machine may (a torn
// tail, or nothing written since the last checkpoint), and opens the file
// again. The records read must be the history's state after some prefix of
// it: one no shorter than the last Flush acknowledged (the last Sync after a
// machine crash). Four such runs follow each other on one file, each
// starting from what the one before left, so a replay that drops or
// restores something at a second restart is caught.

const (
	envJournalPath = "TIDEMARK_JOURNAL_PATH"
	envJournalSeed = "TIDEMARK_JOURNAL_SEED"
	journalMaxOps  = 20000 // the child stops there and waits to be killed
)

var journalKeys = func() []offsetfile.Key {
	var ks []offsetfile.Key
	for _, topic := range []string{"t0", "t1"} {
		for p := range int32(8) {
			ks = append(ks, offsetfile.Key{Group: "g", Topic: topic, Partition: p})
		}
	}
	return ks
}()

// jop is one step of a history.
type jop struct {
	kind byte // w SetWatermark, p Put, r RecordReset, c SetCommitAttempt, f RecordFailure, F Flush, S Sync
	key  offsetfile.Key
	a, b int64
	gen  int32
}

// journalHistory returns the history of seed, one step per call.
func journalHistory(seed uint64) func() jop {
	rng := rand.New(rand.NewPCG(seed, 7))
	// Failure offsets never recorded before, in this history or an
	// earlier one on the file: each counts once.
	failure := rng.Int64N(1<<50) << 10
	return func() jop {
		op := jop{key: journalKeys[rng.IntN(len(journalKeys))], a: rng.Int64N(1 << 20), b: rng.Int64N(1 << 20), gen: rng.Int32N(50)}
		switch n := rng.IntN(100); {
		case n < 70:
			op.kind = 'w'
		case n < 76:
			op.kind = 'p'
		case n < 81:
			op.kind = 'r'
		case n < 89:
			op.kind = 'c'
		case n < 90:
			op.kind = 'f'
			failure++
			op.a = failure
		case n < 97:
			op.kind = 'F'
		default:
			op.kind = 'S'
		}
		return op
	}
}

var fixedTime = time.Date(2026, 12, 2, 10, 0, 0, 0, time.Local)

// apply applies op to s.
func (op jop) apply(ctx context.Context, s *offsetfile.Store) error {
	switch op.kind {
	case 'w':
		return s.SetWatermark(op.key, op.a, op.gen, fmt.Sprintf("m%d", op.gen))
	case 'p':
		r := offsetfile.Record{Watermark: op.a, Committed: op.b, Generation: op.gen, Member: "put", RecordedAt: fixedTime}
		if op.gen%2 == 0 {
			r.Completed = []offsetfile.Range{{From: op.a + 2, To: op.a + 5}, {From: op.a + 9, To: op.a + 10}}
		}
		return s.Put(op.key, r)
	case 'r':
		return s.RecordReset(op.key, offsetfile.Reset{From: op.a, To: op.b, Reason: "model"})
	case 'c':
		return s.SetCommitAttempt(op.key, offsetfile.CommitAttempt{Offset: op.a, Generation: op.gen, Outcome: offsetfile.CommitOK})
	case 'f':
		return s.RecordFailure(op.key, offsetfile.Failure{Offset: op.a, Action: offsetfile.FailureSkip, Attempts: 1, Reason: "model"})
	case 'F':
		return s.Flush(ctx)
	case 'S':
		return s.Sync(ctx)
	}
	return fmt.Errorf("unknown step %q", op.kind)
}

// jview is what the model follows of a record: every field the history
// sets, times aside.
type jview struct {
	Watermark, Committed   int64
	Generation             int32
	Member                 string
	Completed              []offsetfile.Range
	ResetFrom, ResetTo     int64
	Skipped, CommitAttempt int64
}

func viewOf(r offsetfile.Record) jview {
	v := jview{Watermark: r.Watermark, Committed: r.Committed, Generation: r.Generation, Member: r.Member,
		Completed: r.Completed, ResetFrom: -2, ResetTo: -2, Skipped: r.Skipped, CommitAttempt: -1}
	if r.LastReset != nil {
		v.ResetFrom, v.ResetTo = r.LastReset.From, r.LastReset.To
	}
	if r.LastCommit != nil {
		v.CommitAttempt = r.LastCommit.Offset
	}
	return v
}

func (v jview) equal(w jview) bool {
	type scalars struct {
		a, b, c, d, e, f int64
		g                int32
		m                string
	}
	sv := scalars{v.Watermark, v.Committed, v.ResetFrom, v.ResetTo, v.Skipped, v.CommitAttempt, v.Generation, v.Member}
	sw := scalars{w.Watermark, w.Committed, w.ResetFrom, w.ResetTo, w.Skipped, w.CommitAttempt, w.Generation, w.Member}
	return sv == sw && slices.Equal(v.Completed, w.Completed)
}

// step applies op to the model m, as the store does.
func (m jmodel) step(op jop) {
	v, ok := m[op.key]
	if !ok {
		v = viewOf(offsetfile.Record{Watermark: -1, Committed: -1})
	}
	switch op.kind {
	case 'w':
		v.Watermark, v.Generation, v.Member, v.Completed = op.a, op.gen, fmt.Sprintf("m%d", op.gen), nil
	case 'p':
		v = jview{Watermark: op.a, Committed: op.b, Generation: op.gen, Member: "put", ResetFrom: -2, ResetTo: -2, CommitAttempt: -1}
		if op.gen%2 == 0 {
			v.Completed = []offsetfile.Range{{From: op.a + 2, To: op.a + 5}, {From: op.a + 9, To: op.a + 10}}
		}
	case 'r':
		v.Watermark, v.Completed, v.ResetFrom, v.ResetTo = op.b, nil, op.a, op.b
		if v.Committed > op.b {
			v.Committed = -1
		}
	case 'c':
		v.Committed, v.CommitAttempt = op.a, op.a
	case 'f':
		v.Skipped++
	default:
		return
	}
	m[op.key] = v
}

type jmodel map[offsetfile.Key]jview

func (m jmodel) equal(o jmodel) bool {
	if len(m) != len(o) {
		return false
	}
	for k, v := range m {
		if w, ok := o[k]; !ok || !v.equal(w) {
			return false
		}
	}
	return true
}

func (m jmodel) ndiff(o jmodel) int {
	n := 0
	for _, k := range journalKeys {
		v, vok := m[k]
		w, wok := o[k]
		if vok != wok || (vok && !v.equal(w)) {
			n++
		}
	}
	return n
}

func (m jmodel) diff(o jmodel) string {
	var b strings.Builder
	for _, k := range journalKeys {
		v, vok := m[k]
		w, wok := o[k]
		if vok != wok || (vok && !v.equal(w)) {
			fmt.Fprintf(&b, "\n  %s/%d: model %+v (%v), file %+v (%v)", k.Topic, k.Partition, v, vok, w, wok)
		}
	}
	return b.String()
}

func readModel(t *testing.T, path string, opts *offsetfile.Options) jmodel {
	t.Helper()
	s := mustOpen(t, path, opts)
	m := jmodel{}
	for _, e := range s.Records() {
		m[e.Key] = viewOf(e.Record)
	}
	must(t, s.Close())
	return m
}

// journalChild is the child of TestJournalModel: it applies the history of
// its seed to the store at its path, printing "F i" or "S i" once a Flush or
// Sync made the first i steps durable or synced.
func journalChild() int {
	seed, err := strconv.ParseUint(os.Getenv(envJournalSeed), 10, 64)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s, err := offsetfile.Open(os.Getenv(envJournalPath), &offsetfile.Options{SyncInterval: 20 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("open")
	next := journalHistory(seed)
	ctx := context.Background()
	for i := 1; i <= journalMaxOps; i++ {
		op := next()
		if err := op.apply(ctx, s); err != nil {
			fmt.Fprintf(os.Stderr, "step %d %q: %v\n", i, op.kind, err)
			return 2
		}
		if op.kind == 'F' || op.kind == 'S' {
			fmt.Printf("%c %d\n", op.kind, i)
		}
	}
	fmt.Println("done")
	select {} // until killed
}

func TestJournalModel(t *testing.T) {
	runs := 4
	if testing.Short() {
		runs = 2
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TIDEMARK_JOURNAL_MODEL_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (TIDEMARK_JOURNAL_MODEL_SEED reruns it)", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for round := range 5 {
		path := tempPath(t)
		base := jmodel{}
		for run := range runs {
			childSeed := rng.Uint64()
			machine := run%2 == 1 // a crash of the machine, not only the process
			stopAt := 1 + rng.IntN(200)
			lastF, lastS := journalKill(t, path, childSeed, stopAt, rng)
			what := "process crash"
			if machine {
				what = "machine crash: " + cutJournal(t, path, rng)
			}
			floor := lastF
			if machine {
				floor = lastS
			}
			// A read-only open replays in memory what a read-write one
			// folds into the file: they must agree.
			ro := readModel(t, path, &offsetfile.Options{ReadOnly: true})
			got := readModel(t, path, nil)
			if !ro.equal(got) {
				t.Fatalf("round %d run %d (%s): a read-only open reads other records than a read-write one:%s", round, run, what, ro.diff(got))
			}
			if _, err := os.Stat(path + offsetfile.JournalSuffix); !os.IsNotExist(err) {
				t.Fatalf("round %d run %d: the journal is still there after an Open and Close without SyncInterval (%v)", round, run, err)
			}
			checkFile(t, path)
			// got must be the history's state after some step >= floor.
			model := jmodel{}
			for k, v := range base {
				model[k] = v
			}
			next := journalHistory(childSeed)
			var floorModel jmodel
			found := -1
			bestN, best := len(journalKeys)+1, -1
			for i := 0; i <= journalMaxOps; i++ {
				if i > 0 {
					model.step(next())
				}
				if i == floor {
					floorModel = jmodel{}
					for k, v := range model {
						floorModel[k] = v
					}
				}
				if n := model.ndiff(got); n < bestN {
					bestN, best = n, i
				}
				if i >= floor && model.equal(got) {
					found = i
					break
				}
			}
			if found < 0 {
				t.Fatalf("seed %d round %d run %d (%s): the records are the history's state after no step at or after %d (the last %s acknowledged; the nearest is step %d, %d keys differ); against that step:%s",
					seed, round, run, what, floor, map[bool]string{false: "Flush", true: "Sync"}[machine], best, bestN, floorModel.diff(got))
			}
			t.Logf("round %d run %d (%s): killed after %d acknowledgements; the file holds steps 1-%d (Flush acknowledged %d, Sync %d)",
				round, run, what, stopAt, found, lastF, lastS)
			base = got
		}
	}
}

// journalKill runs the child on path until it acknowledged stopAt Flushes
// and Syncs (or finished its history), lets it run a little more, SIGKILLs
// it, and returns the last Flush and Sync it acknowledged.
func journalKill(t *testing.T, path string, seed uint64, stopAt int, rng *rand.Rand) (lastF, lastS int) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), testsupport.EnvChild+"=journal", envJournalPath+"="+path, envJournalSeed+"="+strconv.FormatUint(seed, 10))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	must(t, cmd.Start())
	r := bufio.NewScanner(out)
	acks := 0
	for acks < stopAt && r.Scan() {
		f := strings.Fields(r.Text())
		if len(f) == 2 {
			i, _ := strconv.Atoi(f[1])
			if f[0] == "F" {
				lastF = i
			} else {
				lastS = i
			}
			lastF = max(lastF, lastS) // a Sync is a Flush too
			acks++
		}
		if f[0] == "done" {
			break
		}
	}
	time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	go func() { // drain, so that the child never blocks on a full pipe before the signal lands
		for r.Scan() {
		}
	}()
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("child: %v, want killed; stderr:\n%s", err, stderr.String())
	}
	if acks == 0 {
		t.Fatalf("the child acknowledged nothing; stderr:\n%s", stderr.String())
	}
	return lastF, lastS
}

// cutJournal does to the journal what a crash of the machine may: keep
// any prefix of what was written since the last fsync, with or without a
// partial entry after it, or garbage after it.
func cutJournal(t *testing.T, path string, rng *rand.Rand) string {
	t.Helper()
	jp := path + offsetfile.JournalSuffix
	b, err := os.ReadFile(jp)
	if os.IsNotExist(err) {
		return "no journal"
	}
	must(t, err)
	// Past the last byte that is not zero lies the window's unused part
	// (journal.go): what was written is before it.
	used := offsetfile.Written(b)
	n := rng.IntN(used + 1)
	what := fmt.Sprintf("journal cut to %d of %d bytes written", n, used)
	switch rng.IntN(3) {
	case 0:
		junk := make([]byte, 1+rng.IntN(64))
		for i := range junk {
			junk[i] = byte(rng.Uint32())
		}
		b = append(b[:n], junk...)
		what += fmt.Sprintf(", %d bytes of garbage after", len(junk))
	case 1:
		clear(b[n:]) // the file's length kept, the rest as allocated
		what += fmt.Sprintf(", zeros to its %d bytes", len(b))
	default:
		b = b[:n]
	}
	must(t, os.WriteFile(jp, b, 0o600))
	return what
}

var jkey = offsetfile.Key{Group: "g", Topic: "t", Partition: 3}

// A journal whose truncation after a checkpoint did not reach the disk holds
// entries the checkpoint already folded in, maybe older than the file's:
// they must not be replayed over it.
func TestJournalStaleEntriesIgnored(t *testing.T) {
	path := tempPath(t)
	s := mustOpen(t, path, &offsetfile.Options{SyncInterval: time.Hour})
	must(t, s.SetWatermark(jkey, 1, 1, "m"))
	flush(t, s) // the first flush checkpoints: the file has no generation yet
	must(t, s.SetWatermark(jkey, 10, 1, "m"))
	flush(t, s)
	if rec, _ := s.Durable(jkey); rec.Watermark != 10 {
		t.Fatalf("Durable after Flush: watermark %d, want 10", rec.Watermark)
	}
	if rec, _ := s.Synced(jkey); rec.Watermark != 1 {
		t.Fatalf("Synced after a Flush within SyncInterval: watermark %d, want 1 (the first flush's)", rec.Watermark)
	}
	old, err := os.ReadFile(path + offsetfile.JournalSuffix)
	must(t, err)
	if len(old) == 0 {
		t.Fatal("the journal is empty after a Flush within SyncInterval")
	}
	must(t, s.SetWatermark(jkey, 5, 2, "m"))
	must(t, s.Sync(context.Background()))
	if rec, _ := s.Synced(jkey); rec.Watermark != 5 {
		t.Fatalf("Synced after Sync: watermark %d, want 5", rec.Watermark)
	}
	emptied, err := os.ReadFile(path + offsetfile.JournalSuffix)
	must(t, err)
	if i := slices.IndexFunc(emptied, func(b byte) bool { return b != 0 }); i >= 0 {
		t.Fatalf("the journal after a checkpoint: byte %d of %d is not zero; want no entry left", i, len(emptied))
	}
	must(t, s.Close())
	if _, err := os.Stat(path + offsetfile.JournalSuffix); !os.IsNotExist(err) {
		t.Fatalf("the journal after Close: %v, want removed", err)
	}
	must(t, os.WriteFile(path+offsetfile.JournalSuffix, old, 0o600)) // the stale entry, back
	rep := checkOK(t, path)
	wantFinding(t, rep, offsetfile.SeverityInfo, "1 entries of an earlier checkpoint")
	if got := readModel(t, path, nil); got[jkey].Watermark != 5 {
		t.Fatalf("watermark %d after reopening with a stale journal, want 5 (the checkpoint's)", got[jkey].Watermark)
	}
}

// A whole entry (its checksum right) that does not decode is not a torn
// write: Open refuses the file, naming the journal and how to recover.
func TestJournalBadEntryRefused(t *testing.T) {
	path := tempPath(t)
	s := mustOpen(t, path, &offsetfile.Options{SyncInterval: time.Hour})
	must(t, s.SetWatermark(jkey, 10, 1, "m"))
	flush(t, s)
	must(t, s.SetWatermark(jkey, 11, 1, "m"))
	flush(t, s)
	b := testsupport.Crash(t, s, path)
	rep := checkOK(t, path)
	wantFinding(t, rep, offsetfile.SeverityInfo, "journal: 1 entries (1 records)")
	b = testsupport.BadJournalEntry(b)
	must(t, os.WriteFile(path+offsetfile.JournalSuffix, b, 0o600))
	err := wantOpenError(t, path, nil, path+offsetfile.JournalSuffix+": entry at byte 0", "move the journal aside")
	if !errors.Is(err, offsetfile.ErrDamaged) {
		t.Errorf("Open: %v, want ErrDamaged", err)
	}
	rep, err = offsetfile.Check(path, nil)
	must(t, err)
	wantFinding(t, rep, offsetfile.SeverityError, "journal", "move the journal aside")
	must(t, os.Rename(path+offsetfile.JournalSuffix, path+".aside"))
	if got := readModel(t, path, nil); got[jkey].Watermark != 10 {
		t.Fatalf("after moving the journal aside: watermark %d, want 10 (the first flush's checkpoint)", got[jkey].Watermark)
	}
}

// Journaled updates reach a checkpoint within SyncInterval without a Sync:
// the writer's timer takes them there.
func TestJournalCheckpointsEverySyncInterval(t *testing.T) {
	path := tempPath(t)
	s := mustOpen(t, path, &offsetfile.Options{SyncInterval: 50 * time.Millisecond})
	must(t, s.SetWatermark(jkey, 1, 1, "m"))
	flush(t, s)
	for wm := int64(2); wm < 5; wm++ {
		must(t, s.SetWatermark(jkey, wm, 1, "m"))
		flush(t, s)
		deadline := time.Now().Add(10 * time.Second)
		for {
			rec, _ := s.Synced(jkey)
			if rec.Watermark == wm {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("watermark %d durable but not synced 10s later (SyncInterval 50ms): synced %d", wm, rec.Watermark)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// SyncedProgress answers what Synced does, watermark and completed ranges,
// over random histories of journaled updates, flushes, checkpoints and
// reopens.
func TestSyncedProgressIsSynced(t *testing.T) {
	path := tempPath(t)
	opts := &offsetfile.Options{SyncInterval: time.Hour} // checkpoints when asked
	s := mustOpen(t, path, opts)
	defer func() { must(t, s.Close()) }()
	rng := rand.New(rand.NewPCG(7, 11))
	keys := []offsetfile.Key{jkey, {Group: "g", Topic: "t", Partition: 4}, {Group: "g", Topic: "u", Partition: 0}}
	next := make([]int64, len(keys))
	ctx := context.Background()
	for step := range 600 {
		i := rng.IntN(len(keys))
		k := keys[i]
		switch rng.IntN(7) {
		case 0, 1:
			next[i] += int64(1 + rng.IntN(5))
			must(t, s.SetWatermark(k, next[i], 1, "m"))
		case 2:
			next[i] += int64(1 + rng.IntN(5))
			rec, _ := s.Get(k)
			rec.Watermark, rec.Completed = next[i], []offsetfile.Range{{From: next[i] + 2, To: next[i] + 4}}
			must(t, s.Put(k, rec))
		case 3:
			must(t, s.SetCommitAttempt(k, offsetfile.CommitAttempt{Offset: next[i], Generation: 1, At: time.Now(), Outcome: offsetfile.CommitOK}))
		case 4:
			flush(t, s)
		case 5:
			must(t, s.Sync(ctx))
		case 6:
			if rng.IntN(10) == 0 {
				must(t, s.Close())
				s = mustOpen(t, path, opts)
			}
		}
		for _, k := range keys {
			rec, ok := s.Synced(k)
			wm, completed, got := s.SyncedProgress(k)
			if got != ok || wm != rec.Watermark || !slices.Equal(completed, rec.Completed) {
				t.Fatalf("step %d: %v: SyncedProgress = %d %v %v, Synced = %d %v %v", step, k, wm, completed, got, rec.Watermark, rec.Completed, ok)
			}
		}
	}
}
