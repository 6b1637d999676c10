package offsetfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Severity says how much a Finding of Check matters.
type Severity uint8

// Severities, from least to most serious.
const (
	// SeverityInfo: worth knowing, not wrong. Examples: a run left open
	// (the last consumer ended uncleanly), Kafka's last confirmed commit
	// ahead of the watermark (a reset or a repair moved the watermark
	// back; the next start resumes at Kafka's committed offset).
	SeverityInfo Severity = iota + 1
	// SeverityWarning: the file opens, but holds something the framework
	// never writes: failure counts that disagree with the failure entries,
	// failure entries without a record, unknown buckets or keys.
	SeverityWarning
	// SeverityError: the file is damaged: bbolt's structural check failed,
	// or a value does not decode. Open refuses such a file.
	SeverityError
)

func (s Severity) String() string {
	switch s {
	case SeverityInfo:
		return "info"
	case SeverityWarning:
		return "warning"
	case SeverityError:
		return "error"
	}
	return fmt.Sprintf("Severity(%d)", uint8(s))
}

// Finding is one thing Check found.
type Finding struct {
	Severity Severity
	// Key names the partition the finding is about; nil for the whole
	// file.
	Key     *Key
	Message string
}

func (f Finding) String() string {
	if f.Key != nil {
		return fmt.Sprintf("%s: %s/%s/%d: %s", f.Severity, f.Key.Group, f.Key.Topic, f.Key.Partition, f.Message)
	}
	return fmt.Sprintf("%s: %s", f.Severity, f.Message)
}

// CheckReport is what Check found in a file.
type CheckReport struct {
	Path          string
	Size          int64  // bytes
	PageSize      uint32 // bbolt's page size
	TxID          uint64 // bbolt's last transaction id
	SchemaVersion uint32
	// Records counts the record values, by value encoding version (1 or
	// 2); values that do not decode count under their first byte.
	Records map[byte]int
	// FailureEntries counts the failure entries.
	FailureEntries int
	// JournalEntries counts the journal's entries newer than the file's
	// last checkpoint, which Open applies (see Options.SyncInterval).
	JournalEntries int
	// StateEntries counts the entries of the partitions' states (a
	// TxHandler's; see StateTx).
	StateEntries int
	// Findings, most serious first, then in file order.
	Findings []Finding
}

// Worst returns the severity of the most serious finding; 0 if none.
func (r *CheckReport) Worst() Severity {
	var w Severity
	for _, f := range r.Findings {
		w = max(w, f.Severity)
	}
	return w
}

// maxBoltFindings caps the findings kept from bbolt's structural check,
// which reports every page of a damaged tree.
const maxBoltFindings = 100

// Check examines the file at path without writing to it: a bounds-checked
// walk of bbolt's page tree (page types, element bounds, key order, pages
// reached twice, the freelist, pages neither reachable nor free), the
// schema version, a strict decoding of every record and failure entry, the
// invariants between them, the journal's entries (see Options.SyncInterval:
// how many Open would apply, a torn tail, stale entries, an entry that does
// not decode) and, when the pages are sound, bbolt's own structural check
// (tx.Check). Open refuses a file with an error finding.
// Check takes the file's shared lock, waiting at most opts.Timeout
// (default 1s, as for Open; only Timeout is used), so it fails with
// ErrInUse while a consumer holds the file; an Open while Check runs waits
// for it in turn, and fails with ErrInUse after its own Timeout.
//
// Check returns an error, and no report, when the file cannot be examined
// at all: a missing path, a directory or other non-regular file, an
// unreadable file, a file in use, a file that is not bbolt (ErrSchema), or
// a bbolt file with another schema version or none (ErrSchema). Damage is
// reported as findings of SeverityError, with a nil error: a truncated
// file, a 0-byte one ("0 bytes: ..."), a damaged page or value.
func Check(path string, opts *Options) (*CheckReport, error) {
	var o Options
	if opts != nil {
		o.Timeout = opts.Timeout
	}
	fail := func(err error) (*CheckReport, error) {
		return nil, &FileError{Path: path, Op: "check", Err: err}
	}
	switch {
	case path == "":
		return fail(errors.New("empty path"))
	case o.Timeout < 0:
		return fail(fmt.Errorf("negative Options.Timeout %v", o.Timeout))
	case o.Timeout == 0:
		o.Timeout = defaultTimeout
	}
	o.ReadOnly = true

	rep := &CheckReport{Path: path, Records: map[byte]int{}}
	if _, err := checkPath(path, true); err != nil {
		if !damaged(err) {
			return fail(err)
		}
		// A damaged bbolt file that bbolt cannot open at all.
		rep.Findings = append(rep.Findings, Finding{Severity: SeverityError, Message: err.Error()})
		return rep, nil
	}
	db, err := openBolt(path, &o)
	if err != nil {
		if !damaged(err) {
			return fail(err)
		}
		rep.Findings = append(rep.Findings, Finding{Severity: SeverityError, Message: err.Error()})
		return rep, nil
	}
	defer db.Close()
	if fi, err := os.Stat(path); err == nil {
		rep.Size = fi.Size()
	}
	rep.PageSize = uint32(db.Info().PageSize)
	_, needInit, err := examine(db, path, rep)
	switch {
	case err != nil:
		return fail(err) // schema
	case needInit:
		return fail(&detailError{sentinel: ErrSchema, msg: "file has no buckets (never initialised as a tidemark offset store)"})
	}
	checkJournal(db, path, rep)
	if rep.Worst() < SeverityError {
		// bbolt's own check, as a second opinion: it runs in a goroutine
		// of its own, out of protect's reach, so only on pages walkPages
		// has found sound.
		n := 0
		_ = db.View(func(tx *bolt.Tx) error {
			for err := range tx.Check() {
				if n++; n <= maxBoltFindings {
					rep.Findings = append(rep.Findings, Finding{Severity: SeverityError, Message: "bbolt check: " + err.Error()})
				}
			}
			return nil
		})
		if n > maxBoltFindings {
			rep.Findings = append(rep.Findings, Finding{Severity: SeverityError,
				Message: fmt.Sprintf("bbolt check: %d more problems not listed", n-maxBoltFindings)})
		}
	}
	slices.SortStableFunc(rep.Findings, func(a, b Finding) int { return int(b.Severity) - int(a.Severity) })
	return rep, nil
}

// checkJournal reports what the journal beside the file holds: entries
// Open would replay, and what it would ignore.
func checkJournal(db *bolt.DB, path string, rep *CheckReport) {
	gen, err := journalGen(db)
	if err != nil {
		return // examine has reported the file's damage
	}
	jr, err := readJournal(path, gen)
	if err != nil {
		rep.Findings = append(rep.Findings, Finding{Severity: SeverityError, Message: "journal unreadable: " + err.Error()})
		return
	}
	rep.JournalEntries = jr.entries
	info := func(format string, args ...any) {
		rep.Findings = append(rep.Findings, Finding{Severity: SeverityInfo, Message: fmt.Sprintf(format, args...)})
	}
	switch {
	case jr.bad != nil:
		rep.Findings = append(rep.Findings, Finding{Severity: SeverityError, Message: (&journalError{err: jr.bad}).Error()})
	case jr.entries > 0:
		info("journal: %d entries (%d records) newer than the file's last checkpoint (the last run ended without one); Open applies them", jr.entries, len(jr.recs))
	}
	if jr.torn > 0 {
		info("journal: its last %d bytes are a partial entry (a write cut short by a crash of the machine); Open ignores them", jr.torn)
	}
	if jr.stale > 0 {
		info("journal: %d entries of an earlier checkpoint, already in the file; Open ignores them", jr.stale)
	}
}

// examine checks db, the open file at path, as Check does without bbolt's
// own check: it walks the page tree (walkPages) and, if the pages are
// sound, checks the schema version and decodes every record and failure
// entry. Its findings go to rep; it returns the records that decode. It
// returns needInit for a bbolt file without buckets, and an error for a
// file that is no tidemark offset store (ErrSchema) or cannot be read.
func examine(db *bolt.DB, path string, rep *CheckReport) (recs map[Key]Record, needInit bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, false, unwrapPathError(err, path)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, false, unwrapPathError(err, path)
	}
	// Read again under the lock that db holds: checkPath read it before.
	m, err := checkHeader(f, fi.Size())
	if err != nil {
		if !damaged(err) {
			return nil, false, err
		}
		rep.Findings = append(rep.Findings, Finding{Severity: SeverityError, Message: err.Error()})
		return nil, false, nil
	}
	rep.TxID = m.txid
	if problems := walkPages(f, fi.Size(), m, nil); len(problems) > 0 {
		for _, p := range problems {
			rep.Findings = append(rep.Findings, Finding{Severity: SeverityError, Message: "corrupt bbolt database: " + p})
		}
		// bbolt cannot be trusted with these pages: report what the sound
		// ones hold, read as Salvage reads them.
		sv := &Salvaged{Failures: map[Key][]Failure{}}
		walkPages(f, fi.Size(), m, func(path [][]byte, k, v []byte) {
			switch {
			case len(path) == 3 && string(path[0]) == string(groupsBucket) && len(v) > 0:
				rep.Records[v[0]]++
			case len(path) == 3 && string(path[0]) == string(failuresBucket):
				rep.FailureEntries++
			case len(path) == 1 && string(path[0]) == string(metaBucket) && string(k) == string(schemaKey) && len(v) == 4:
				rep.SchemaVersion = binary.BigEndian.Uint32(v)
			}
			if p := sv.salvage(path, k, v); p != "" {
				rep.Findings = append(rep.Findings, Finding{Severity: SeverityError, Message: p})
			}
		})
		return nil, false, nil
	}
	var c *checker
	err = protect(func() error {
		return db.View(func(tx *bolt.Tx) error {
			rep.TxID = uint64(tx.ID())
			var err error
			if needInit, err = checkSchema(tx); err != nil || needInit {
				return err
			}
			rep.SchemaVersion = binary.BigEndian.Uint32(tx.Bucket(metaBucket).Get(schemaKey))
			c = &checker{rep: rep, tx: tx, recs: map[Key]Record{}, failures: map[Key][2]int64{}}
			c.walk()
			return nil
		})
	})
	var de *detailError
	switch {
	case errors.As(err, &de) && errors.Is(err, ErrSchema):
		return nil, false, err
	case err != nil:
		rep.Findings = append(rep.Findings, Finding{Severity: SeverityError, Message: err.Error()})
		return nil, false, nil
	case c == nil:
		return nil, needInit, nil
	}
	return c.recs, false, nil
}

// refusal is Open's error for a file whose check found errors: the first
// of them, how many more, and how to recover.
func refusal(rep *CheckReport) error {
	var errs []Finding
	for _, f := range rep.Findings {
		if f.Severity == SeverityError {
			errs = append(errs, f)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	first := errs[0].Message
	if k := errs[0].Key; k != nil {
		first = keyString(*k) + ": " + first
	}
	more := ""
	switch n := len(errs) - 1; {
	case n == 1:
		more = " (and 1 more finding)"
	case n > 1:
		more = fmt.Sprintf(" (and %d more findings)", n)
	}
	return &detailError{sentinel: ErrDamaged, msg: fmt.Sprintf("damaged: %s%s; %s", first, more, recoverHint(rep.Path))}
}

// recoverHint says how to recover from a damaged file.
func recoverHint(path string) string {
	return fmt.Sprintf("`tidemark check %s` lists the findings. To recover: `tidemark export --salvage %s > offsets.json` "+
		"writes what can still be read, then move the file aside and `tidemark import %s < offsets.json`; "+
		"or move it aside to start with no history", path, path, path)
}

// hintedError adds recoverHint to an error wrapping ErrDamaged that does
// not say how to recover.
type hintedError struct {
	err  error
	path string
}

func (e *hintedError) Error() string { return e.err.Error() + "; " + recoverHint(e.path) }
func (e *hintedError) Unwrap() error { return e.err }

func withHint(path string, err error) error {
	var je *journalError
	if errors.As(err, &je) {
		return err // says how to recover from it
	}
	if !errors.Is(err, ErrDamaged) || err == errEmptyFile || strings.Contains(err.Error(), "tidemark export --salvage") {
		return err
	}
	return &hintedError{err: err, path: path}
}

// damaged reports whether an error of checkPath or openBolt means a bbolt
// file that is damaged (rather than a file that cannot be checked at all).
// Those errors carry no sentinel of their own; their text is this
// package's.
func damaged(err error) bool {
	return errors.Is(err, ErrDamaged) && !errors.Is(err, ErrSchema)
}

type checker struct {
	rep  *CheckReport
	tx   *bolt.Tx
	recs map[Key]Record
	// failures counts the failure entries per key: [skipped, dead-lettered].
	failures map[Key][2]int64
	keys     []Key // of recs, in file order
}

func (c *checker) add(sev Severity, k *Key, format string, args ...any) {
	if k != nil {
		kk := *k
		k = &kk
	}
	c.rep.Findings = append(c.rep.Findings, Finding{Severity: sev, Key: k, Message: fmt.Sprintf(format, args...)})
}

func (c *checker) walk() {
	_ = c.tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		switch string(name) {
		case string(metaBucket), string(groupsBucket), string(failuresBucket), string(stateBucket), string(changelogBucket):
		default:
			c.add(SeverityWarning, nil, "unknown top-level bucket %q", truncName(name))
		}
		return nil
	})
	_ = c.tx.Bucket(metaBucket).ForEach(func(k, v []byte) error {
		switch {
		case string(k) == string(schemaKey):
		case string(k) == string(journalKey) && len(v) == 8:
		default:
			c.add(SeverityWarning, nil, "unknown key %q in the %q bucket", truncName(k), metaBucket)
		}
		return nil
	})
	if groups := c.tx.Bucket(groupsBucket); groups != nil {
		c.records(groups)
	} else {
		c.add(SeverityWarning, nil, "no %q bucket", groupsBucket)
	}
	if fb := c.tx.Bucket(failuresBucket); fb != nil {
		c.failureEntries(fb)
	}
	if sb := c.tx.Bucket(stateBucket); sb != nil {
		c.stateEntries(sb)
	}
	if cb := c.tx.Bucket(changelogBucket); cb != nil {
		c.outboxEntries(cb)
	}
	c.invariants()
}

// stateEntries checks the partitions' states: a bucket per partition, under
// its group's and topic's, holding values of a known format.
func (c *checker) stateEntries(root *bolt.Bucket) {
	c.nested(root, "state", func(g []byte, gb *bolt.Bucket) {
		c.nested(gb, fmt.Sprintf("state of group %q", truncName(g)), func(t []byte, tb *bolt.Bucket) {
			where := fmt.Sprintf("state of group %q topic %q", truncName(g), truncName(t))
			c.nested(tb, where, func(p []byte, pb *bolt.Bucket) {
				part, err := decodePartitionKey(p)
				if err != nil {
					c.add(SeverityError, nil, "%s: %v", where, err)
					return
				}
				k := Key{Group: string(g), Topic: string(t), Partition: part}
				bad, big := 0, 0
				_ = pb.ForEach(func(key, v []byte) error {
					c.rep.StateEntries++
					if v == nil || len(v) == 0 || v[0] != stateValueV1 {
						if bad++; bad == 1 {
							c.add(SeverityError, &k, "state key %q: a bucket or a value of an unknown format", truncName(key))
						}
						return nil
					}
					if len(key) > MaxStateKey || len(v)-1 > MaxStateValue {
						if big++; big == 1 {
							c.add(SeverityWarning, &k, "state key %q: a key of %d bytes or a value of %d, over MaxStateKey or MaxStateValue (the framework writes neither)",
								truncName(key), len(key), len(v)-1)
						}
					}
					return nil
				})
				if bad > 1 {
					c.add(SeverityError, &k, "%d state entries in all are of an unknown format", bad)
				}
			})
		})
	})
}

// nested calls fn for every bucket in b, and reports plain keys where
// buckets belong.
func (c *checker) nested(b *bolt.Bucket, where string, fn func(name []byte, child *bolt.Bucket)) {
	_ = b.ForEach(func(k, v []byte) error {
		if v != nil {
			c.add(SeverityError, nil, "%s: unexpected key %q where a bucket belongs", where, truncName(k))
			return nil
		}
		fn(k, b.Bucket(k))
		return nil
	})
}

func (c *checker) records(groups *bolt.Bucket) {
	c.nested(groups, "groups", func(g []byte, gb *bolt.Bucket) {
		c.nested(gb, fmt.Sprintf("group %q", truncName(g)), func(t []byte, tb *bolt.Bucket) {
			_ = tb.ForEach(func(p, v []byte) error {
				part, err := decodePartitionKey(p)
				if err != nil {
					c.add(SeverityError, nil, "group %q topic %q: %v", truncName(g), truncName(t), err)
					return nil
				}
				k := Key{Group: string(g), Topic: string(t), Partition: part}
				if v == nil {
					c.add(SeverityError, &k, "a bucket where a record belongs")
					return nil
				}
				if len(v) > 0 {
					c.rep.Records[v[0]]++
				}
				rec, err := decodeRecord(v)
				if err != nil {
					c.add(SeverityError, &k, "record does not decode: %v", err)
					return nil
				}
				if err := validateKey(k); err != nil {
					c.add(SeverityError, &k, "%v", err)
				}
				c.recs[k] = rec
				c.keys = append(c.keys, k)
				return nil
			})
		})
	})
}

func (c *checker) failureEntries(fb *bolt.Bucket) {
	c.nested(fb, "failures", func(g []byte, gb *bolt.Bucket) {
		c.nested(gb, fmt.Sprintf("failures of group %q", truncName(g)), func(t []byte, tb *bolt.Bucket) {
			where := fmt.Sprintf("failures of group %q topic %q", truncName(g), truncName(t))
			_ = tb.ForEach(func(key, v []byte) error {
				if v == nil {
					c.add(SeverityError, nil, "%s: a bucket where a failure entry belongs", where)
					return nil
				}
				c.rep.FailureEntries++
				if len(key) != 12 {
					c.add(SeverityError, nil, "%s: key is %d bytes, want 12", where, len(key))
					return nil
				}
				part, err := decodePartitionKey(key[:4])
				if err != nil {
					c.add(SeverityError, nil, "%s: %v", where, err)
					return nil
				}
				k := Key{Group: string(g), Topic: string(t), Partition: part}
				f, err := decodeFailure(key, v)
				if err != nil {
					c.add(SeverityError, &k, "failure entry does not decode: %v", err)
					return nil
				}
				n := c.failures[k]
				if f.Action == FailureSkip {
					n[0]++
				} else {
					n[1]++
				}
				c.failures[k] = n
				return nil
			})
		})
	})
}

// futureSlack is how far in the future a recorded time may be before Check
// mentions it (clock skew between hosts, or a bad clock).
const futureSlack = time.Hour

func (c *checker) invariants() {
	horizon := time.Now().Add(futureSlack)
	for _, k := range c.keys {
		r := c.recs[k]
		n := c.failures[k]
		// Counts above the entries are expected once the entries were
		// pruned to DefaultKeepFailures (a smaller Options.KeepFailures
		// shows here as a disagreement).
		pruned := n[0]+n[1] >= DefaultKeepFailures && r.Skipped >= n[0] && r.DeadLettered >= n[1]
		if (r.Skipped != n[0] || r.DeadLettered != n[1]) && !pruned {
			c.add(SeverityWarning, &k, "failure counts (%d skipped, %d dead-lettered) disagree with the failure entries (%d skipped, %d dead-lettered)",
				r.Skipped, r.DeadLettered, n[0], n[1])
		}
		if r.Watermark >= 0 && r.Committed > r.Watermark {
			c.add(SeverityInfo, &k, "last confirmed commit %d is ahead of the watermark %d (a reset or a repair moved the watermark back, or the record was imported); the next start resumes at Kafka's committed offset if it is still ahead",
				r.Committed, r.Watermark)
		}
		if r.Run != nil && r.Run.Open {
			c.add(SeverityInfo, &k, "run open: the last consumer holding the partition did not release it cleanly (crash, SIGKILL, power loss)")
		}
		if r.Run != nil && r.Run.Crashes > 0 {
			c.add(SeverityInfo, &k, "%d unclean ends in a row while handling offset %d", r.Run.Crashes, r.Run.Inflight)
		}
		if lc := r.LastCommit; lc != nil && lc.Outcome != CommitOK {
			c.add(SeverityInfo, &k, "last commit attempt (offset %d) ended %s", lc.Offset, lc.Outcome)
		}
		for _, t := range []struct {
			name string
			at   time.Time
		}{{"recorded-at", r.RecordedAt}, {"committed-at", r.CommittedAt}} {
			if t.at.After(horizon) {
				c.add(SeverityInfo, &k, "%s time %s is in the future (clock skew?)", t.name, t.at.UTC().Format(time.RFC3339))
			}
		}
	}
	var orphans []Key
	for k := range c.failures {
		if _, ok := c.recs[k]; !ok {
			orphans = append(orphans, k)
		}
	}
	slices.SortFunc(orphans, compareKeys)
	for _, k := range orphans {
		n := c.failures[k]
		c.add(SeverityWarning, &k, "%d failure entries but no record", n[0]+n[1])
	}
}
