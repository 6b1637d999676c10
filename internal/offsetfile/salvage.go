package offsetfile

import (
	"encoding/binary"
	"errors"
	"fmt"
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
	// StateEntries counts the partitions' state entries found: Salvage
	// does not carry them (see salvage).
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

	out := &Salvaged{Failures: map[Key][]Failure{}}
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
	problems := walkPages(f, size, m, func(path [][]byte, k, v []byte) {
		if p := out.salvage(path, k, v); p != "" {
			out.Problems = append(out.Problems, p)
		}
		if len(path) == 1 && string(path[0]) == string(metaBucket) && string(k) == string(schemaKey) && len(v) == 4 {
			schema = int(binary.BigEndian.Uint32(v))
		}
	})
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
	if out.StateEntries > 0 {
		out.Problems = append(out.Problems, fmt.Sprintf("%d state entries (a TxHandler's) are not salvaged: "+
			"a state is consistent only with the watermark written with it; a partition's state must be rebuilt", out.StateEntries))
	}
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
	if len(path) > 0 && string(path[0]) == string(stateBucket) {
		// A state is not carried over: it is consistent only with the
		// watermark of the transaction that wrote it, which a damaged file
		// cannot vouch for. Reported as a problem (see Salvage).
		out.StateEntries++
		return ""
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
