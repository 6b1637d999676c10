package offsetfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// Bucket and key names of the file layout (see doc.go).
var (
	metaBucket   = []byte("meta")
	schemaKey    = []byte("schema")
	groupsBucket = []byte("groups")
)

// checkPath rejects, before bbolt touches anything, paths that cannot be a
// store: a missing parent directory, a directory, an empty (0-byte) file, a
// file that is not bbolt, and a bbolt file that is truncated (bbolt would
// fault reading the missing pages). unsyncedFreelist reports a bbolt
// file without a persisted freelist, which a read-write bbolt.Open rewrites.
func checkPath(path string, readOnly bool) (unsyncedFreelist bool, err error) {
	dir := filepath.Dir(path)
	di, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, &detailError{sentinel: fs.ErrNotExist, msg: fmt.Sprintf("parent directory %s does not exist", dir)}
	case err != nil:
		return false, unwrapPathError(err, "")
	case !di.IsDir():
		return false, fmt.Errorf("parent %s is not a directory", dir)
	}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if readOnly {
			return false, fs.ErrNotExist
		}
		return false, nil // bbolt creates it
	case err != nil:
		return false, unwrapPathError(err, path)
	case fi.IsDir():
		return false, errors.New("is a directory, not a file")
	case !fi.Mode().IsRegular():
		return false, fmt.Errorf("not a regular file (mode %v)", fi.Mode())
	case fi.Size() == 0:
		// bbolt would initialise it as a new file. A file that had history
		// and lost it (truncated by a crash, a restore, a shell redirect)
		// looks the same, and starting over must be the operator's choice.
		return false, errEmptyFile
	}
	f, err := os.Open(path)
	if err != nil {
		return false, unwrapPathError(err, path)
	}
	defer f.Close()
	m, err := checkHeader(f, fi.Size())
	return m.freelist == noFreelist, err
}

// bbolt's on-disk meta page (internal/common/meta.go, page.go), native byte
// order: a 16-byte page header, then magic, version, pageSize, flags
// (uint32), root bucket (root pgid, sequence), freelist pgid, high-water
// pgid, txid, checksum (uint64). The checksum is FNV-64a of the 56 bytes
// before it.
const (
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	pageHeaderSize = 16
	metaSize       = 64
	noFreelist     = 0xffffffffffffffff
)

type boltMeta struct {
	pageSize uint32
	root     uint64 // the root bucket's page
	freelist uint64 // noFreelist if the freelist is not persisted
	pgid     uint64 // high-water mark: pages [0, pgid) are in use
	txid     uint64
}

var (
	errShortFile = errors.New("short file")
	errNoMagic   = errors.New("no bbolt magic number")
	errEmptyFile = &detailError{sentinel: ErrDamaged, msg: "0 bytes: an existing offset file with nothing in it is not taken as a new one " +
		"(its history may have been lost: a crash, a restore, a shell redirect); move it aside or delete it to start with no history"}
)

// readMeta reads the meta page at off, and says what is wrong if it is not a
// valid one.
func readMeta(f io.ReaderAt, off int64) (boltMeta, error) {
	var buf [pageHeaderSize + metaSize]byte
	if _, err := f.ReadAt(buf[:], off); err != nil {
		return boltMeta{}, errShortFile
	}
	b := buf[pageHeaderSize:]
	ne := binary.NativeEndian
	if ne.Uint32(b[0:]) != boltMagic {
		return boltMeta{}, errNoMagic
	}
	if v := ne.Uint32(b[4:]); v != boltVersion {
		return boltMeta{}, fmt.Errorf("bbolt format version %d, want %d", v, boltVersion)
	}
	h := fnv.New64a()
	h.Write(b[:56])
	if h.Sum64() != ne.Uint64(b[56:]) {
		return boltMeta{}, errors.New("meta page checksum mismatch")
	}
	m := boltMeta{pageSize: ne.Uint32(b[8:]), root: ne.Uint64(b[16:]), freelist: ne.Uint64(b[32:]), pgid: ne.Uint64(b[40:]), txid: ne.Uint64(b[48:])}
	if m.pageSize < 1024 || m.pageSize > 1<<24 || m.pageSize&(m.pageSize-1) != 0 {
		return boltMeta{}, fmt.Errorf("implausible page size %d", m.pageSize)
	}
	return m, nil
}

// checkHeader validates the bbolt meta pages the way bbolt picks them (the
// valid one with the higher transaction id) and checks that the file holds
// every page the meta page says is in use.
func checkHeader(f io.ReaderAt, size int64) (boltMeta, error) {
	m0, err0 := readMeta(f, 0)
	var m1 boltMeta
	err1 := errors.New("not found")
	if err0 == nil {
		m1, err1 = readMeta(f, int64(m0.pageSize))
	} else {
		// Page 0 is damaged, so its page size is unknown: try them all, like bbolt.
		for ps := int64(1024); ps <= 1<<24 && ps+pageHeaderSize+metaSize <= size; ps <<= 1 {
			m, err := readMeta(f, ps)
			if err == nil && int64(m.pageSize) == ps {
				m1, err1 = m, nil
				break
			}
			if err != nil && err != errNoMagic {
				err1 = err // a meta page, damaged
			}
		}
	}
	var m boltMeta
	switch {
	case err0 == nil && err1 == nil:
		m = m0
		if m1.txid > m0.txid {
			m = m1
		}
	case err0 == nil:
		m = m0
	case err1 == nil:
		m = m1
	case err0 == errNoMagic || err0 == errShortFile:
		return m, &detailError{sentinel: ErrSchema, msg: fmt.Sprintf("not a tidemark offset store: not a bbolt database (%v, %d bytes)", err0, size)}
	default:
		return m, &detailError{sentinel: ErrDamaged, cause: berrors.ErrInvalid,
			msg: fmt.Sprintf("corrupt bbolt database: both meta pages are invalid (page 0: %v; page 1: %v)", err0, err1)}
	}
	if m.pgid < 2 || m.pgid > uint64(size)/uint64(m.pageSize) {
		return m, &detailError{sentinel: ErrDamaged, msg: fmt.Sprintf(
			"truncated or corrupt bbolt database: file is %d bytes but its meta page (txid %d) uses %d pages of %d bytes", size, m.txid, m.pgid, m.pageSize)}
	}
	// bbolt grows a file by whole pages: a partial page is a truncation.
	if size%int64(m.pageSize) != 0 {
		return m, &detailError{sentinel: ErrDamaged, msg: fmt.Sprintf(
			"truncated or corrupt bbolt database: file is %d bytes, not a whole number of %d-byte pages", size, m.pageSize)}
	}
	return m, nil
}

// unwrapPathError drops an *fs.PathError for path, whose text would repeat
// the path that FileError already names, keeping its cause.
func unwrapPathError(err error, path string) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && (path == "" || pe.Path == path) {
		if path == "" {
			return fmt.Errorf("%s: %w", pe.Path, pe.Err)
		}
		return pe.Err
	}
	return err
}

// openBolt opens the bbolt file; it turns a lock timeout into ErrInUse and a
// panic inside bbolt (a corrupt file bbolt does not detect) into an error.
func openBolt(path string, opts *Options) (db *bolt.DB, err error) {
	var file *os.File
	bopts := &bolt.Options{
		Timeout:         opts.Timeout,
		ReadOnly:        opts.ReadOnly,
		NoSync:          opts.NoSync,
		InitialMmapSize: opts.MmapSize,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		},
	}
	defer func() {
		if r := recover(); r != nil {
			if file != nil { // drop the half-opened DB's lock and file; its mapping leaks
				unlockFile(file)
				file.Close()
			}
			db, err = nil, &detailError{sentinel: ErrDamaged, msg: fmt.Sprintf("corrupt bbolt database: bbolt failed reading it: %v", r)}
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	db, err = bolt.Open(path, 0o600, bopts)
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		holder := ""
		if pid := lockHolder(path); pid > 0 {
			holder = fmt.Sprintf("pid %d holds its lock; ", pid)
		}
		return nil, &detailError{sentinel: ErrInUse, msg: fmt.Sprintf("%v (%slock not acquired within %v)", ErrInUse, holder, opts.Timeout)}
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrVersionMismatch):
		return nil, &detailError{sentinel: ErrSchema, msg: "not a tidemark offset store", cause: err}
	case err != nil:
		return nil, unwrapPathError(err, path)
	}
	return db, nil
}

// protect runs fn, turning a panic or a memory fault (bbolt reading a
// corrupt page) into an error wrapping ErrDamaged. It guards every bbolt
// transaction of this package: Open refuses a file whose pages it cannot
// walk (walkPages), but a page can be damaged after Open, by another
// process or the disk, and bbolt reads it unchecked. Only bbolt's reads
// run inside it; this package's own decoding checks its bounds and returns
// errors.
func protect(fn func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &detailError{sentinel: ErrDamaged, msg: fmt.Sprintf("corrupt bbolt database: bbolt failed reading it: %v", r)}
		}
	}()
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return fn()
}

// precheck validates the file (pages, schema, records and failure entries)
// through a read-only open, for files that a read-write bbolt.Open would
// write to.
func precheck(path string, opts *Options) error {
	ro := *opts
	ro.ReadOnly, ro.NoSync = true, false
	db, err := openBolt(path, &ro)
	if err != nil {
		return err
	}
	defer db.Close()
	rep := &CheckReport{Path: path, Records: map[byte]int{}}
	if _, _, err := examine(db, path, rep); err != nil {
		return err
	}
	return refusal(rep)
}

// checkSchema reports whether the file must be initialised, or why it is
// refused.
func checkSchema(tx *bolt.Tx) (needInit bool, err error) {
	meta := tx.Bucket(metaBucket)
	if meta == nil {
		var other []byte
		_ = tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
			other = name
			return errStop
		})
		if other != nil {
			return false, &detailError{sentinel: ErrSchema, msg: fmt.Sprintf(
				"not a tidemark offset store: no %q bucket but a bucket %q (this build supports schema version %d)",
				metaBucket, truncName(other), SchemaVersion)}
		}
		return true, nil
	}
	v := meta.Get(schemaKey)
	if len(v) != 4 {
		return false, &detailError{sentinel: ErrSchema, msg: fmt.Sprintf(
			"schema version unreadable (%d-byte value, want 4); this build supports schema version %d", len(v), SchemaVersion)}
	}
	if found := binary.BigEndian.Uint32(v); found != SchemaVersion {
		return false, &detailError{sentinel: ErrSchema, msg: fmt.Sprintf(
			"file has schema version %d, this build supports schema version %d", found, SchemaVersion)}
	}
	return false, nil
}

var errStop = errors.New("stop")

func truncName(b []byte) string {
	const max = 64
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}

// initSchema writes the meta bucket and schema version into a file with no
// buckets.
func initSchema(tx *bolt.Tx) error {
	meta, err := tx.CreateBucket(metaBucket)
	if err != nil {
		return err
	}
	var v [4]byte
	binary.BigEndian.PutUint32(v[:], SchemaVersion)
	if err := meta.Put(schemaKey, v[:]); err != nil {
		return err
	}
	_, err = tx.CreateBucket(groupsBucket)
	return err
}
