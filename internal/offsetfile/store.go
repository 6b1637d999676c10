package offsetfile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
)

// Store is an open offset store file. All methods are safe for concurrent
// use. Open it with Open and release it with Close.
type Store struct {
	path     string
	db       *bolt.DB
	readOnly bool
	interval time.Duration
	// syncInterval is Options.SyncInterval; 0 checkpoints every flush.
	syncInterval time.Duration
	onFlush      func(time.Duration, int, error) // Options.OnFlush
	log          *zap.Logger

	kick chan struct{} // wakes the writer; capacity 1
	stop chan struct{} // closed by Close
	done chan struct{} // closed when the writer has exited

	closeOnce sync.Once

	mu        sync.Mutex
	closed    bool              // Close was called: no new updates
	stopped   bool              // the writer has exited (or never ran)
	kicked    bool              // a kick is in the channel, or the writer looks again soon (run)
	kicks     uint64            // updates that woke the writer, for tests
	pending   []queuedUpdate    // the keys' queued updates, not yet durable (slot.queuedAt)
	inflightF map[Key][]Failure // failure entries the running flush transaction writes
	keepFails int               // Options.KeepFailures
	// slots holds each key's records in memory (slot.go): at 10,000
	// partitions a flush touches every key, and one lookup per key (none
	// after it) is most of what made it cheap.
	slots      map[Key]*slot
	flushes    uint64 // flushes that took queued updates (slot.taken)
	seq        uint64 // bumped by each queued update
	flushedSeq uint64 // every update up to this seq is durable
	// The journal (journal.go) and what it holds beyond the last
	// checkpoint; the writer goroutine owns j, s.mu guards the rest.
	j      *journal
	spare  []queuedUpdate // the pending list of the last flush, cleared
	writes []pendingWrite // the writer's buffers, reused by each flush
	// inflight holds the records the running flush writes (slot.inflight
	// points into it): one array for the flush, not one record per slot.
	inflight []Record
	encoded  []byte
	order    []int32
	// pendingState holds the state changes of committed runs (state.go),
	// per partition, oldest first, for the next checkpoint: they live in
	// the file only, never in the journal. inflightState is what the
	// checkpoint being written carries. Runs read both (newest first) over
	// the file; a run's changes are never modified once committed, and the
	// lists only grow past what a run has seen. stateEpoch fences the runs
	// of a partition's earlier assignments (FenceState).
	pendingState  map[Key]stateRuns
	inflightState map[Key]stateRuns
	stateEpoch    map[Key]uint64
	// stateIndex finds a key among a partition's queued runs (runindex.go);
	// runSeq numbers the runs as they are committed.
	stateIndex map[Key]*runIndex
	runSeq     uint64
	// pendingImports are the partitions' states PutState queued, for the
	// next checkpoint, which writes them after the runs' changes.
	pendingImports []stateImport
	// unsynced lists the slots durable in the journal only, changed since
	// the last checkpoint; each keeps its record as of that checkpoint
	// (slot.synced, what Synced returns).
	unsynced  []*slot
	syncedSeq uint64               // every update up to this seq is synced
	syncWant  uint64               // Sync asks for a checkpoint covering this seq
	lastSync  time.Time            // start of the last checkpoint
	flushErr  error                // result of the last flush transaction
	flushed   chan struct{}        // closed and replaced after each flush attempt
	testHook  func(*bolt.Tx) error // internal tests: runs inside each flush transaction
	// dirtyMarkers are the Markers with a value not folded into pending
	// yet (see marker.go); each key's live Marker is in its slot.
	dirtyMarkers []*Marker
}

// Open opens the store at path, creating the file (mode 0600) if it does not
// exist; its directory must exist. It waits at most opts.Timeout for the
// file lock, then fails with an error wrapping ErrInUse. A file that is not a
// tidemark offset store, or has another schema version, is refused with an
// error wrapping ErrSchema. A file that Check would report damaged (an
// error finding), a truncated one and a 0-byte one are refused with an
// error wrapping ErrDamaged that names the first finding and how to
// recover. In every refusal the file is left as it was. A bbolt file
// without buckets is initialised.
//
// Open checks the file as Check does, bbolt's own check aside: it walks
// every page of the tree, decodes every record and failure entry, and
// loads the records into memory. For a file of 10,000 partitions that is
// 30-50 ms against 11-17 ms without the check (BenchmarkOpenCheck10000,
// BenchmarkOpenNoCheck10000). Warnings of that check are logged. Unless opts.ReadOnly
// is set it starts one writer goroutine, which Close stops.
func Open(path string, opts *Options) (*Store, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	fail := func(err error) (*Store, error) {
		return nil, &FileError{Path: path, Op: "open", Err: withHint(path, err)}
	}
	switch {
	case path == "":
		return fail(errors.New("empty path"))
	case o.Timeout < 0:
		return fail(fmt.Errorf("negative Options.Timeout %v", o.Timeout))
	case o.FlushInterval < 0:
		return fail(fmt.Errorf("negative Options.FlushInterval %v", o.FlushInterval))
	case o.SyncInterval < 0:
		return fail(fmt.Errorf("negative Options.SyncInterval %v", o.SyncInterval))
	}
	if o.Timeout == 0 {
		o.Timeout = defaultTimeout
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.KeepFailures == 0 {
		o.KeepFailures = DefaultKeepFailures
	}

	unsyncedFreelist, err := checkPath(path, o.ReadOnly)
	if err != nil {
		return fail(err)
	}
	if unsyncedFreelist && !o.ReadOnly {
		// A read-write bbolt.Open would write this file's freelist before
		// it is checked: check it read-only first.
		if err := precheck(path, &o); err != nil {
			return fail(err)
		}
	}
	db, err := openBolt(path, &o)
	if err != nil {
		return fail(err)
	}
	// Everything Check reads, read now: a damaged page or value is refused
	// here, not met by the consumer midway (a failure entry is read at the
	// first dead letter of its partition).
	rep := &CheckReport{Path: path, Records: map[byte]int{}}
	recs, needInit, err := examine(db, path, rep)
	if err == nil && !needInit {
		err = refusal(rep)
	}
	if err == nil {
		logWarnings(o.Logger, path, rep)
	}
	if err == nil && needInit {
		if o.ReadOnly {
			err = &detailError{sentinel: ErrSchema, msg: "file has no buckets (never initialised as a tidemark offset store)"}
		} else {
			err = db.Update(initSchema)
			recs = make(map[Key]Record)
		}
	}
	var jr *journalRead
	if err == nil {
		jr, err = replayJournal(db, path, o.Logger)
	}
	if err != nil {
		_ = db.Close()
		return fail(err)
	}

	s := &Store{
		path:         path,
		db:           db,
		readOnly:     o.ReadOnly,
		interval:     o.FlushInterval,
		syncInterval: o.SyncInterval,
		onFlush:      o.OnFlush,
		keepFails:    o.KeepFailures,
		log:          o.Logger.Named("offsetstore").With(zap.String("path", path)),
		kick:         make(chan struct{}, 1),
		stop:         make(chan struct{}),
		done:         make(chan struct{}),
		slots:        make(map[Key]*slot, len(recs)),
		flushed:      make(chan struct{}),
	}
	for k, rec := range recs {
		s.slots[k] = &slot{key: k, durable: rec, hasDurable: true}
	}
	for k, rec := range jr.recs {
		sl := s.slotLocked(k)
		if o.ReadOnly {
			s.journaledLocked(sl)
		}
		sl.durable, sl.hasDurable = rec, true
	}
	if o.ReadOnly {
		s.stopped = true
		close(s.done)
		return s, nil
	}
	if err := s.openJournal(jr); err != nil {
		_ = db.Close()
		return fail(err)
	}
	go s.run()
	return s, nil
}

// Path returns the file's path as given to Open.
func (s *Store) Path() string { return s.path }

func (s *Store) fileErr(op string, err error) error {
	return &FileError{Path: s.path, Op: op, Err: err}
}

// queuedLocked counts an update queued and wakes the writer unless it is
// already woken; it is called with s.mu held and unlocks it.
func (s *Store) queuedLocked() {
	s.seq++
	wake := !s.kicked
	s.kicked = true
	if wake {
		s.kicks++
	}
	s.mu.Unlock()
	if wake {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// wakeLocked wakes the writer, with s.mu held.
func (s *Store) wakeLocked() {
	s.kicked = true
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// enqueue merges p into the pending update of k and wakes the writer.
func (s *Store) enqueue(op string, k Key, p patch) error { return s.enqueueWith(op, k, p, nil) }

// enqueueWith is enqueue that first calls also, if not nil, under s.mu: an
// error from it queues nothing and is returned.
func (s *Store) enqueueWith(op string, k Key, p patch, also func() error) error {
	s.mu.Lock()
	switch {
	case s.readOnly:
		s.mu.Unlock()
		return s.fileErr(op, ErrReadOnly)
	case s.closed:
		s.mu.Unlock()
		return s.fileErr(op, ErrClosed)
	}
	if also != nil {
		if err := also(); err != nil {
			s.mu.Unlock()
			return s.fileErr(op, err)
		}
	}
	s.foldKeyLocked(k) // a Marker's value set before this update comes first
	s.queueLocked(s.slotLocked(k), p)
	s.queuedLocked()
	return nil
}

// SetWatermark queues watermark (the next offset to process) for k, recorded
// now by the given generation and member. It does not wait for the disk: see
// Flush and Durable. Updates are merged per key; the latest value wins, and
// the store does not require watermarks to increase. It clears the record's
// Completed ranges: a watermark set alone says nothing about the offsets
// above it (NewProgressMarker records both).
func (s *Store) SetWatermark(k Key, watermark int64, generation int32, member string) error {
	const op = "set watermark"
	p, err := s.watermarkPatch(op, k, watermark, generation, member)
	if err != nil {
		return err
	}
	return s.enqueue(op, k, p)
}

// watermarkPatch is the update that sets k's watermark, recorded now by
// generation and member, once they are checked.
func (s *Store) watermarkPatch(op string, k Key, watermark int64, generation int32, member string) (patch, error) {
	if err := validateKey(k); err != nil {
		return patch{}, s.fileErr(op, err)
	}
	if watermark < 0 {
		return patch{}, s.fileErr(op, fmt.Errorf("%s: negative watermark %d", keyString(k), watermark))
	}
	if err := validateString("member id", member); err != nil {
		return patch{}, s.fileErr(op, fmt.Errorf("%s: %w", keyString(k), err))
	}
	return patch{
		fields: setWatermark | setOwner,
		rec:    Record{Watermark: watermark, RecordedAt: now(), Generation: generation, Member: member},
	}, nil
}

// SetCommitted queues offset as the last offset known committed to Kafka for
// k, at now.
func (s *Store) SetCommitted(k Key, offset int64) error {
	const op = "set committed"
	if err := validateKey(k); err != nil {
		return s.fileErr(op, err)
	}
	if offset < 0 {
		return s.fileErr(op, fmt.Errorf("%s: negative committed offset %d", keyString(k), offset))
	}
	return s.enqueue(op, k, patch{
		fields: setCommitted,
		rec:    Record{Committed: offset, CommittedAt: now()},
	})
}

// RecordReset queues r as k's LastReset and moves the watermark to r.To
// (RecordedAt is set to now; Generation and Member are kept) and clears the
// Completed ranges. A Committed offset above r.To is cleared (-1): it
// described the log before the reset. A zero r.At is set to now.
func (s *Store) RecordReset(k Key, r Reset) error {
	const op = "record reset"
	if err := validateKey(k); err != nil {
		return s.fileErr(op, err)
	}
	t := now()
	if r.At.IsZero() {
		r.At = t
	}
	if err := validateReset(&r); err != nil {
		return s.fileErr(op, fmt.Errorf("%s: %w", keyString(k), err))
	}
	r.At = normTime(r.At)
	p := patch{
		fields: setWatermark | setReset,
		rec:    Record{Watermark: r.To, RecordedAt: t, LastReset: &r},
	}
	s.mu.Lock()
	cur, _ := s.latestLocked(k)
	s.mu.Unlock()
	if cur.Committed > r.To {
		// What Kafka confirmed before a reset back no longer describes
		// the log: none is known until the next confirmed commit.
		p.fields |= setCommitted
		p.rec.Committed = -1
	}
	return s.enqueue(op, k, p)
}

// Put queues r as the whole record of k, replacing every field (for tools
// that import or set records), Completed included: the ranges must suit
// r.Watermark (see Record.Completed); Put copies them. Times are stored with
// nanosecond precision, without monotonic clock reading, in time.Local.
func (s *Store) Put(k Key, r Record) error {
	const op = "put"
	if err := validateKey(k); err != nil {
		return s.fileErr(op, err)
	}
	if err := validateRecord(&r); err != nil {
		return s.fileErr(op, fmt.Errorf("%s: %w", keyString(k), err))
	}
	return s.enqueue(op, k, putPatch(r))
}

// putPatch is the update that replaces a record whole with a copy of r,
// once r is checked.
func putPatch(r Record) patch {
	r = r.clone()
	r.RecordedAt, r.CommittedAt = normTime(r.RecordedAt), normTime(r.CommittedAt)
	if r.LastReset != nil {
		r.LastReset.At = normTime(r.LastReset.At)
	}
	if r.LastCommit != nil {
		r.LastCommit.At = normTime(r.LastCommit.At)
	}
	return patch{fields: setAll, rec: r}
}

// SetRun queues r as k's run state, for the crash-loop breaker.
func (s *Store) SetRun(k Key, r RunState) error {
	const op = "set run state"
	if err := validateKey(k); err != nil {
		return s.fileErr(op, err)
	}
	if err := validateRun(&r); err != nil {
		return s.fileErr(op, fmt.Errorf("%s: %w", keyString(k), err))
	}
	return s.enqueue(op, k, patch{fields: setRun, rec: Record{Run: &r}})
}

// SetCommitAttempt queues a as k's last commit attempt (the commit ledger).
// When a.Outcome is CommitOK, Committed and CommittedAt are set too. A zero
// a.At is set to now.
func (s *Store) SetCommitAttempt(k Key, a CommitAttempt) error {
	const op = "set commit attempt"
	if err := validateKey(k); err != nil {
		return s.fileErr(op, err)
	}
	t := now()
	if a.At.IsZero() {
		a.At = t
	}
	if err := validateCommit(&a); err != nil {
		return s.fileErr(op, fmt.Errorf("%s: %w", keyString(k), err))
	}
	a.At = normTime(a.At)
	p := patch{fields: setLedger, rec: Record{LastCommit: &a}}
	if a.Outcome == CommitOK {
		p.fields |= setCommitted
		p.rec.Committed, p.rec.CommittedAt = a.Offset, t
	}
	return s.enqueue(op, k, p)
}

// latestLocked is Get without the clone; s.mu must be held.
func (s *Store) latestLocked(k Key) (Record, bool) {
	s.foldKeyLocked(k)
	var rec Record
	var ok bool
	if sl := s.slots[k]; sl != nil {
		rec, ok = sl.durable, sl.hasDurable
		if sl.inflight != nil {
			rec, ok = *sl.inflight, true
		}
	}
	if !ok {
		rec = emptyRecord()
	}
	if p, ok := s.queuedPatchLocked(s.slots[k]); ok {
		return p.apply(rec), true
	}
	return rec, ok
}

// Get returns the latest record of k: the durable one with the updates
// queued, or being written, applied. It returns (Record{Watermark: -1, Committed: -1}, false)
// if k has neither.
func (s *Store) Get(k Key) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.latestLocked(k)
	return rec.clone(), ok
}

// Durable returns the record of k as last persisted, ignoring queued
// updates: what the next Open reads after this process dies (SIGKILL, OOM).
// With Options.SyncInterval it may be in the journal only, not fsync-ed
// yet: see Synced for what survives the machine. It returns
// (Record{Watermark: -1, Committed: -1}, false) if nothing is persisted for
// k.
func (s *Store) Durable(k Key) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slots[k].durableRecord()
}

// Synced returns the record of k as of the last checkpoint: written to the
// file and fsync-ed (unless Options.NoSync), so it survives a crash of the
// machine too. This is the watermark that is safe to commit to Kafka: the
// file never falls behind it. Without Options.SyncInterval it is Durable.
func (s *Store) Synced(k Key) (Record, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.slots[k].syncedRecord()
	if !ok {
		return emptyRecord(), false
	}
	return rec.clone(), true
}

// SyncedProgress is Synced's watermark and completed ranges alone (the
// ranges copied), without copying the rest of the record: the committer
// asks it of every owned partition each CommitInterval.
func (s *Store) SyncedProgress(k Key) (watermark int64, completed []Range, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rec, ok := s.slots[k].syncedRecord()
	if !ok {
		return -1, nil, false
	}
	if len(rec.Completed) > 0 {
		completed = slices.Clone(rec.Completed)
	}
	return rec.Watermark, completed, true
}

// Records returns every durable record, sorted by group, topic, partition.
func (s *Store) Records() []Entry {
	s.mu.Lock()
	out := make([]Entry, 0, len(s.slots))
	for k, sl := range s.slots {
		if sl.hasDurable {
			out = append(out, Entry{Key: k, Record: sl.durable.clone()})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int { return compareKeys(a.Key, b.Key) })
	return out
}

// Err returns the error of the last flush transaction: nil once a later one
// succeeds.
func (s *Store) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flushErr
}

// Flush waits until every update queued before the call is durable (see
// Durable). It returns early with ctx's error when ctx is done, and with the
// flush error when a flush transaction fails meanwhile (the updates stay
// queued and the writer retries). After Close it returns an error wrapping
// ErrClosed. On a read-only store it returns nil at once.
func (s *Store) Flush(ctx context.Context) error {
	return s.wait(ctx, "flush", &s.flushedSeq)
}

// Sync is Flush, and then some: it waits until every update queued before
// the call is synced (see Synced), asking the writer for a checkpoint now
// rather than at the end of Options.SyncInterval. Without SyncInterval it
// is Flush.
func (s *Store) Sync(ctx context.Context) error {
	return s.wait(ctx, "sync", &s.syncedSeq)
}

// wait waits until *done (flushedSeq or syncedSeq) reaches the updates
// queued before the call.
func (s *Store) wait(ctx context.Context, op string, done *uint64) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return s.fileErr(op, ErrClosed)
	}
	target := s.seq
	if done == &s.syncedSeq && s.syncedSeq < target {
		s.syncWant = max(s.syncWant, target)
		s.wakeLocked()
	}
	for {
		switch {
		case *done >= target:
			s.mu.Unlock()
			return nil
		case s.stopped:
			s.mu.Unlock()
			return s.fileErr(op, ErrClosed)
		}
		ch := s.flushed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return s.fileErr(op, context.Cause(ctx))
		}
		s.mu.Lock()
		if *done < target && s.flushErr != nil {
			err := s.flushErr
			s.mu.Unlock()
			return err
		}
	}
}

// Close flushes the queued updates, stops the writer goroutine and closes
// the file. If that last flush fails, Close returns its error, and the
// updates it could not write are lost. Close is idempotent: later calls
// return nil. It is safe to call concurrently with every other method;
// calls made after it fail with ErrClosed, except the readers (Get,
// Durable, Records, Err), which keep answering from memory.
func (s *Store) Close() error {
	var err error
	s.closeOnce.Do(func() { err = s.close() })
	return err
}

func (s *Store) close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	close(s.stop)
	<-s.done // the writer has made its last flush

	var err error
	s.mu.Lock()
	if lost := len(s.pending); lost > 0 && s.flushErr != nil {
		err = s.fileErr("close", fmt.Errorf("final flush failed, %d queued updates not persisted: %w", lost, errors.Unwrap(s.flushErr)))
	}
	s.mu.Unlock()
	if cerr := s.db.Close(); cerr != nil && err == nil {
		err = s.fileErr("close", cerr)
	}
	return err
}

// maxLoggedWarnings bounds the warnings of the check at Open that are
// logged one by one; `tidemark check` lists them all.
const maxLoggedWarnings = 10

// logWarnings logs the warnings of the check at Open: the file opens, but
// holds what the framework never writes (failure counts that disagree with
// the entries after a salvage, unknown keys).
func logWarnings(log *zap.Logger, path string, rep *CheckReport) {
	n := 0
	for _, f := range rep.Findings {
		if f.Severity != SeverityWarning {
			continue
		}
		if n++; n <= maxLoggedWarnings {
			log.Warn("offset file check: "+f.String(), zap.String("path", path))
		}
	}
	if n > maxLoggedWarnings {
		log.Warn(fmt.Sprintf("offset file check: %d more warnings; `tidemark check %s` lists them", n-maxLoggedWarnings, path), zap.String("path", path))
	}
}
