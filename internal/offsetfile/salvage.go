package offsetfile

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
)

// Salvaged is what Salvage read of a file.
type Salvaged struct {
	// Records that decode, sorted by group, topic, partition.
	Records []Entry
	// Failures are the failure entries that decode, by key, in offset
	// order.
	Failures map[Key][]Failure
	// States are the partitions' states (a TxHandler's) with their
	// changelog side, for the partitions whose state buckets were read
	// whole: no problem in them or in a bucket above them. A state is
	// consistent only with the watermark written with it, in the same
	// transaction: a part of one is worse than none, and is left out
	// (named in Problems).
	States map[Key]*StateDump
	// StateEntries counts the state entries found, those left out too.
	StateEntries int
	// Problems says what could not be read, each naming where: a page of
	// the tree (and with it every record or entry below it), a record or
	// a failure entry (its bucket and key). Empty for a sound file.
	Problems []string
}

// Salvage reads what it can of the file at path, for a file that Open
// refuses as damaged: the records and failure entries on the pages that
// are sound, and what it could not read. It reads the file's bytes itself,
// every offset bounds-checked, never through bbolt, and never writes. It
// takes the file's shared lock (unix; elsewhere none), waiting at most
// opts.Timeout (default 1s; only Timeout is used).
//
// It returns an error, and nothing salvaged, when the file cannot be read
// at all: missing, not a regular file, in use (ErrInUse), not bbolt
// (ErrSchema), both meta pages damaged (ErrDamaged), or a schema version
// other than SchemaVersion (ErrSchema).
func Salvage(path string, opts *Options) (*Salvaged, error) {
	timeout := defaultTimeout
	if opts != nil && opts.Timeout > 0 {
		timeout = opts.Timeout
	}
	fail := func(err error) (*Salvaged, error) {
		return nil, &FileError{Path: path, Op: "salvage", Err: err}
	}
	if path == "" {
		return fail(errors.New("empty path"))
	}
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return fail(unwrapPathError(err, path))
	case !fi.Mode().IsRegular():
		return fail(fmt.Errorf("not a regular file (mode %v)", fi.Mode()))
	case fi.Size() == 0:
		return fail(errEmptyFile)
	}
	f, err := os.Open(path)
	if err != nil {
		return fail(unwrapPathError(err, path))
	}
	defer f.Close()
	if err := lockShared(f, timeout); err != nil {
		return fail(err)
	}
	size := fi.Size()
	if fi, err := f.Stat(); err == nil {
		size = fi.Size() // under the lock
	}

	out := &Salvaged{Failures: map[Key][]Failure{}, States: map[Key]*StateDump{}}
	var hurt [][][]byte // the buckets where the walk met damage
	m, err := checkHeader(f, size)
	switch {
	case err != nil && m.pageSize == 0: // no meta page to start from
		return fail(err)
	case err != nil:
		out.Problems = append(out.Problems, err.Error())
		// Read the pages that are there.
		m.pgid = min(m.pgid, uint64(size)/uint64(m.pageSize))
	}
	schema := -1
	problems := walkPagesHurt(f, size, m, func(path [][]byte, k, v []byte) {
		if p := out.salvage(path, k, v); p != "" {
			out.Problems = append(out.Problems, p)
		}
		if len(path) == 1 && string(path[0]) == string(metaBucket) && string(k) == string(schemaKey) && len(v) == 4 {
			schema = int(binary.BigEndian.Uint32(v))
		}
	}, func(path [][]byte) { hurt = append(hurt, slices.Clone(path)) })
	if schema != -1 && schema != SchemaVersion {
		return fail(&detailError{sentinel: ErrSchema, msg: fmt.Sprintf(
			"file has schema version %d, this build supports schema version %d", schema, SchemaVersion)})
	}
	for _, p := range problems {
		if isUnreachable(p) {
			continue // a leak, not lost data
		}
		out.Problems = append(out.Problems, "page tree: "+p)
	}
	out.Problems = append(out.Problems, out.dropHurtStates(hurt)...)
	slices.SortFunc(out.Records, func(a, b Entry) int { return compareKeys(a.Key, b.Key) })
	for k, fs := range out.Failures {
		slices.SortFunc(fs, func(a, b Failure) int { return int(min(max(a.Offset-b.Offset, -1), 1)) })
		out.Failures[k] = fs
	}
	return out, nil
}

func isUnreachable(problem string) bool {
	const s = ": unreachable unfreed"
	return len(problem) >= len(s) && problem[len(problem)-len(s):] == s
}

// salvage decodes one key-value pair found by walkPages; it returns a
// problem, or "".
func (out *Salvaged) salvage(path [][]byte, k, v []byte) string {
	if len(path) > 0 && (string(path[0]) == string(stateBucket) || string(path[0]) == string(changelogBucket)) {
		return out.salvageState(path, k, v)
	}
	if len(path) != 3 {
		if len(path) == 1 && string(path[0]) == string(metaBucket) {
			return ""
		}
		return fmt.Sprintf("%s: key %q: not where a record or failure entry belongs", bucketPath(path), truncName(k))
	}
	g, t := string(path[1]), string(path[2])
	where := fmt.Sprintf("group %q topic %q", truncName(path[1]), truncName(path[2]))
	switch string(path[0]) {
	case string(groupsBucket):
		part, err := decodePartitionKey(k)
		if err != nil {
			return fmt.Sprintf("%s: %v", where, err)
		}
		key := Key{Group: g, Topic: t, Partition: part}
		rec, err := decodeRecord(v)
		if err != nil {
			return fmt.Sprintf("%s: record does not decode: %v", keyString(key), err)
		}
		out.Records = append(out.Records, Entry{Key: key, Record: rec})
	case string(failuresBucket):
		if len(k) != 12 {
			return fmt.Sprintf("failures of %s: key is %d bytes, want 12", where, len(k))
		}
		part, err := decodePartitionKey(k[:4])
		if err != nil {
			return fmt.Sprintf("failures of %s: %v", where, err)
		}
		key := Key{Group: g, Topic: t, Partition: part}
		f, err := decodeFailure(k, v)
		if err != nil {
			return fmt.Sprintf("%s: failure entry does not decode: %v", keyString(key), err)
		}
		out.Failures[key] = append(out.Failures[key], f)
	default:
		return fmt.Sprintf("%s: key %q: not where a record or failure entry belongs", bucketPath(path), truncName(k))
	}
	return ""
}

// salvageState takes one key-value pair of a state or changelog bucket;
// it returns a problem, or "". A value that does not decode spoils its
// partition's state (dropHurtStates leaves it out).
func (out *Salvaged) salvageState(path [][]byte, k, v []byte) string {
	if string(path[0]) == string(stateBucket) {
		out.StateEntries++
	}
	if len(path) != 4 {
		return fmt.Sprintf("%s: key %q: not where a state entry belongs", bucketPath(path), truncName(k))
	}
	part, err := decodePartitionKey(path[3])
	if err != nil {
		return fmt.Sprintf("%s: %v", bucketPath(path), err)
	}
	key := Key{Group: string(path[1]), Topic: string(path[2]), Partition: part}
	d := out.States[key]
	if d == nil {
		d = &StateDump{}
		out.States[key] = d
	}
	spoil := func(format string, args ...any) string {
		d.spoilt = true
		return keyString(key) + ": " + fmt.Sprintf(format, args...)
	}
	if string(path[0]) == string(stateBucket) {
		if len(v) == 0 || v[0] != stateValueV1 {
			return spoil("state key %q: a value of an unknown format", truncName(k))
		}
		d.Entries = append(d.Entries, StateEntry{Key: slices.Clone(k), Value: slices.Clone(v[1:])})
		return ""
	}
	switch {
	case len(k) == 8:
		es, err := decodeEntries(nil, binary.BigEndian.Uint64(k), v)
		if err != nil {
			return spoil("changelog outbox entry %d does not decode: %v", binary.BigEndian.Uint64(k), err)
		}
		d.Outbox = append(d.Outbox, es...)
	case string(k) == string(positionKey):
		p, err := decodePosition(v)
		if err != nil {
			return spoil("changelog position does not decode: %v", err)
		}
		d.Changelog = &p
	case string(k) == string(nextSeqKey):
	default:
		return spoil("changelog outbox: unknown key %q", truncName(k))
	}
	return ""
}

// dropHurtStates leaves out of out.States every partition's state that
// the walk may not have read whole: damage in its state or changelog
// bucket, in a bucket above it, or in a value of it. It returns the
// problems that say so.
func (out *Salvaged) dropHurtStates(hurt [][][]byte) []string {
	var problems []string
	isState := func(h [][]byte) bool {
		return len(h) > 0 && (string(h[0]) == string(stateBucket) || string(h[0]) == string(changelogBucket))
	}
	spoilt := map[Key]bool{}
	for k, d := range out.States {
		if d.spoilt {
			spoilt[k] = true
		}
	}
	var above [][][]byte // damaged buckets above the partitions'
	seen := map[string]bool{}
	for _, h := range hurt {
		switch {
		case isState(h) && len(h) >= 4:
			if part, err := decodePartitionKey(h[3]); err == nil {
				spoilt[Key{Group: string(h[1]), Topic: string(h[2]), Partition: part}] = true
			}
		case isState(h) || (len(h) == 0 && len(out.States) > 0):
			// In the root bucket it matters only to a file with states:
			// most files have none.
			if where := bucketPath(h); !seen[where] {
				seen[where] = true
				above = append(above, h)
				// It may have hidden partitions this walk never saw.
				problems = append(problems, fmt.Sprintf("state: damage in the %s: the states of the partitions below it may be missing "+
					"from the export; a partition whose state is missing must be restored or rebuilt (see docs/state.md)", where))
			}
		}
	}
	for k := range out.States {
		pk := partitionKey(k.Partition)
		for _, h := range above {
			for _, root := range [][]byte{stateBucket, changelogBucket} {
				p := [][]byte{root, []byte(k.Group), []byte(k.Topic), pk[:]}
				if len(h) <= len(p) && slices.EqualFunc(h, p[:len(h)], bytes.Equal) {
					spoilt[k] = true
				}
			}
		}
	}
	dropped := slices.SortedFunc(maps.Keys(spoilt), compareKeys)
	for _, k := range dropped {
		delete(out.States, k)
		problems = append(problems, fmt.Sprintf("%s: its state is not exported: the file's damage reaches it, and a part of a state "+
			"is not consistent with the watermark; it must be restored or rebuilt (see docs/state.md)", keyString(k)))
	}
	for k, d := range out.States {
		if d.Empty() {
			delete(out.States, k)
			continue
		}
		slices.SortFunc(d.Entries, func(a, b StateEntry) int { return bytes.Compare(a.Key, b.Key) })
		slices.SortFunc(d.Outbox, func(a, b OutboxEntry) int { return cmp.Compare(a.Seq, b.Seq) })
	}
	return problems
}
