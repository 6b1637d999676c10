package offsetfile

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"
	"go.uber.org/zap"
)

// The journal is an append-only file beside the offset file (its path plus
// JournalSuffix) that makes updates survive the process without an fsync.
// With Options.SyncInterval set, most flushes append the records they
// change to the journal with one write and no fsync: the kernel keeps what
// was written when the process dies (SIGKILL, OOM), so such a record is
// Durable. Every SyncInterval, or when asked (Sync, Close), a checkpoint
// writes every record changed since the last one into the bbolt file in one
// fsync-ed transaction, with a new journal generation, and empties the
// journal: a checkpointed record is Synced, and survives the machine too.
//
// Each entry names the generation of the checkpoint it follows, and only
// entries of the file's generation are replayed: a journal that a crash
// left behind after a checkpoint it was folded into (the checkpoint's
// transaction fsync-ed, the journal not yet emptied) is stale, and ignored.
// The generation starts random, so a journal left beside a file that was
// replaced by another is stale too.
//
// Entry layout, integers big-endian:
//
//	[4]byte  magic "TMJ1"
//	uint32   payload length
//	uint64   generation
//	uint32   CRC-32C of the generation and the payload
//	payload: uvarint record count, then per record:
//	         uvarint len(group), group, uvarint len(topic), topic,
//	         varint partition, uvarint len(value), value (a Record value,
//	         as in the file)
//
// A power loss may keep any part of what was written since the last
// checkpoint: replay stops at the first entry that is incomplete or fails
// its checksum (a torn tail), so it applies a prefix of the entries, each
// newer than the file's records. Zeros after the last entry are the
// journal's unused window (below), not a torn tail.
//
// The window: where the system can map files (window_unix.go), the
// journal's first journalWindow bytes are allocated once and mapped, and
// an entry that fits in them is copied there instead of written with a
// pwrite. What is stored in a shared mapping is in the page cache at once,
// so it survives the process like a write. It costs a few microseconds
// where a pwrite into a file cold from 5 ms of idling costs about 25 (on
// ext4 in a VM): at the default FlushInterval that is most of what the
// journal costs at low rates. A fault in the mapping (an I/O error, or a
// disk full on a file system that allocates on overwrite) is an error
// naming the journal, as a failed write is. A checkpoint zeroes what the
// last generation used instead of truncating. A store that meets its page
// being written back may wait for it, as a pwrite would, but in a page
// fault rather than a system call, so its thread keeps its P meanwhile.
const JournalSuffix = ".journal"

// maxJournalBytes makes the writer checkpoint early when the journal grows
// past it (wide topics, high rates): it bounds Open's replay and the disk
// the journal takes.
const maxJournalBytes = 8 << 20

var (
	journalMagic = [4]byte{'T', 'M', 'J', '1'}
	// journalKey holds the generation in the meta bucket: 8 bytes,
	// big-endian. Absent: no journal entry belongs to the file.
	journalKey = []byte("journal")
	castagnoli = crc32.MakeTable(crc32.Castagnoli)
)

const journalHeader = 20

// maxJournalEntry bounds one entry's payload as read: a length above it is
// a torn or foreign header, not an entry to allocate for.
const maxJournalEntry = 1 << 30

// journal is the open journal file; the writer goroutine owns it.
type journal struct {
	path string
	f    *os.File
	gen  uint64 // the generation of the file's last checkpoint; 0 none
	size int64  // bytes of whole entries written since the last reset
	// broken is set when a write or a reset failed: the journal may end
	// in a partial entry, so every flush checkpoints until a reset
	// succeeds.
	broken bool
	buf    []byte
	// win maps the file's first journalWindow bytes once they are
	// allocated; nil where the system cannot map files, or until the
	// first reset (the file holds the last run's entries until then).
	win []byte
}

// journalWindow is the journal's mapped part: a second of entries at
// moderate rates, small enough to add nothing that matters to RSS. An
// entry past it (wide topics, high rates) is written with a pwrite.
const journalWindow = 256 << 10

// openJournal opens (creating) the journal of the offset file at path for
// writing. The writer resets it before its first entry.
func openJournal(path string) (*journal, error) {
	jp := path + JournalSuffix
	f, err := os.OpenFile(jp, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	return &journal{path: jp, f: f, broken: true}, nil
}

// newGeneration returns the generation of the next checkpoint.
func (j *journal) newGeneration() uint64 {
	if j.gen == 0 {
		return rand.Uint64() | 1 // random start, never 0
	}
	return j.gen + 1
}

// reset empties the journal for entries of gen, whose checkpoint is
// fsync-ed.
func (j *journal) reset(gen uint64) error {
	j.gen = gen
	used := j.size
	j.size = 0
	if err := j.empty(used); err != nil {
		j.broken = true
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	j.broken = false
	return nil
}

// empty leaves the journal without entries. With its window mapped it
// zeroes the bytes used (and truncates what went past the window);
// otherwise, or after a failed write, it truncates the file and allocates
// and maps a zeroed window.
func (j *journal) empty(used int64) error {
	if j.win != nil && !j.broken {
		if err := inWindow(func() { clear(j.win[:min(used, int64(len(j.win)))]) }); err != nil {
			return err
		}
		if used > int64(len(j.win)) {
			return j.f.Truncate(int64(len(j.win)))
		}
		return nil
	}
	if err := j.f.Truncate(0); err != nil {
		return err
	}
	if !canMap {
		return nil
	}
	// Zeros written, not a sparse file: a store into the window then
	// needs no block from the file system.
	if _, err := j.f.WriteAt(make([]byte, journalWindow), 0); err != nil {
		return err
	}
	if j.win == nil {
		j.win = mapFile(j.f, journalWindow) // nil if it cannot: pwrites then
	}
	return nil
}

// inWindow runs fn, which stores into the mapped window, and returns a
// fault in it (an I/O error, no space for the page) as an error instead
// of the SIGBUS that would end the process.
func inWindow(fn func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok {
			err = fmt.Errorf("a fault storing into the mapped window (an I/O error, or no space for the page): %v", f)
			return
		}
		panic(r)
	}()
	fn()
	return nil
}

// append writes one entry holding writes' records, without fsync.
func (j *journal) append(writes []pendingWrite) error {
	b := append(j.buf[:0], journalMagic[:]...)
	b = append(b, make([]byte, journalHeader-len(journalMagic))...)
	b = binary.AppendUvarint(b, uint64(len(writes)))
	for i := range writes {
		w := &writes[i]
		b = appendString(b, w.key.Group)
		b = appendString(b, w.key.Topic)
		b = binary.AppendVarint(b, int64(w.key.Partition))
		b = binary.AppendUvarint(b, uint64(len(w.value)))
		b = append(b, w.value...)
	}
	payload := b[journalHeader:]
	binary.BigEndian.PutUint32(b[4:], uint32(len(payload)))
	binary.BigEndian.PutUint64(b[8:], j.gen)
	binary.BigEndian.PutUint32(b[16:], entryCRC(b[8:16], payload))
	j.buf = b
	var err error
	if j.win != nil && j.size+int64(len(b)) <= int64(len(j.win)) {
		err = inWindow(func() { copy(j.win[j.size:], b) })
	} else {
		_, err = j.f.WriteAt(b, j.size)
	}
	if err != nil {
		j.broken = true
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	j.size += int64(len(b))
	return nil
}

func entryCRC(gen, payload []byte) uint32 {
	return crc32.Update(crc32.Checksum(gen, castagnoli), castagnoli, payload)
}

// close closes the file, and removes it when remove is set (the last
// checkpoint holds everything it had).
func (j *journal) close(remove bool) error {
	err := unmap(j.win)
	j.win = nil
	if cerr := j.f.Close(); err == nil {
		err = cerr
	}
	if remove {
		if rerr := os.Remove(j.path); rerr != nil && err == nil && !errors.Is(rerr, os.ErrNotExist) {
			err = rerr
		}
	}
	return err
}

// journalRead is what readJournal found.
type journalRead struct {
	recs    map[Key]Record // the latest record per key of the entries replayed
	order   []Key          // recs' keys in the order first met
	entries int            // entries replayed
	stale   int            // whole entries of another generation, skipped
	torn    int64          // bytes after the last whole entry
	size    int64
	exists  bool
	gen     uint64 // the file's generation, which the entries replayed carry
	// bad is set for a whole entry (its checksum right) whose payload
	// does not decode: not a torn write, so the journal is refused.
	bad error
}

// readJournal reads the journal of the offset file at path, replaying the
// entries of generation gen (0: none is replayed). A missing journal reads
// as empty.
func readJournal(path string, gen uint64) (*journalRead, error) {
	jp := path + JournalSuffix
	f, err := os.Open(jp)
	if errors.Is(err, os.ErrNotExist) {
		return &journalRead{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("journal %s: not a regular file", jp)
	}
	r := &journalRead{recs: map[Key]Record{}, size: fi.Size(), exists: true}
	var (
		off int64
		hdr [journalHeader]byte
	)
	for {
		if _, err := f.ReadAt(hdr[:], off); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return nil, fmt.Errorf("journal %s: %w", jp, err)
		}
		n := int64(binary.BigEndian.Uint32(hdr[4:]))
		if [4]byte(hdr[:4]) != journalMagic || n > maxJournalEntry || off+journalHeader+n > r.size {
			break
		}
		payload := make([]byte, n)
		if _, err := f.ReadAt(payload, off+journalHeader); err != nil {
			return nil, fmt.Errorf("journal %s: %w", jp, err)
		}
		if entryCRC(hdr[8:16], payload) != binary.BigEndian.Uint32(hdr[16:]) {
			break
		}
		at := off
		off += journalHeader + n
		if g := binary.BigEndian.Uint64(hdr[8:]); gen == 0 || g != gen {
			r.stale++
			continue
		}
		if err := r.replay(payload); err != nil {
			r.bad = fmt.Errorf("journal %s: entry at byte %d: %w", jp, at, err)
			return r, nil
		}
		r.entries++
	}
	end, err := dataEnd(f, off, r.size)
	if err != nil {
		return nil, fmt.Errorf("journal %s: %w", jp, err)
	}
	r.torn = end - off
	return r, nil
}

// written is the length of b up to its last byte that is not zero: the
// window's unused part is zeros.
func written(b []byte) int {
	n := len(b)
	for n > 0 && b[n-1] == 0 {
		n--
	}
	return n
}

// dataEnd returns the end of f's last byte that is not zero, at or after
// off: the zeros after it are the window's unused part.
func dataEnd(f *os.File, off, size int64) (int64, error) {
	end := off
	buf := make([]byte, min(size-off, 64<<10))
	for at := off; at < size; {
		n, err := f.ReadAt(buf[:min(int64(len(buf)), size-at)], at)
		if w := written(buf[:n]); w > 0 {
			end = at + int64(w)
		}
		at += int64(n)
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return 0, err
		}
	}
	return end, nil
}

// replay decodes one entry's payload into r.recs: all of it, or nothing
// when it does not decode.
func (r *journalRead) replay(payload []byte) error {
	d := decoder{b: payload}
	count := d.uvarint("record count")
	if d.err == nil && count > uint64(len(payload)) {
		return fmt.Errorf("record count %d in a %d-byte entry", count, len(payload))
	}
	type entry struct {
		k   Key
		rec Record
	}
	entries := make([]entry, 0, min(count, 1024))
	for i := uint64(0); i < count && d.err == nil; i++ {
		k := Key{Group: d.string("group"), Topic: d.string("topic")}
		p := d.varint("partition")
		n := d.uvarint("value length")
		if d.err != nil {
			break
		}
		if p < 0 || p > 1<<31-1 || n > uint64(len(d.b)) {
			return fmt.Errorf("record %d: partition %d, value of %d bytes with %d left", i, p, n, len(d.b))
		}
		k.Partition = int32(p)
		if err := validateKey(k); err != nil {
			return fmt.Errorf("record %d: %w", i, err)
		}
		rec, err := decodeRecord(d.b[:n])
		if err != nil {
			return fmt.Errorf("record %d (%s): %w", i, keyString(k), err)
		}
		d.b = d.b[n:]
		entries = append(entries, entry{k, rec})
	}
	if d.err != nil {
		return d.err
	}
	if len(d.b) > 0 {
		return fmt.Errorf("%d bytes after the last record", len(d.b))
	}
	for _, e := range entries {
		if _, seen := r.recs[e.k]; !seen {
			r.order = append(r.order, e.k)
		}
		r.recs[e.k] = e.rec
	}
	return nil
}

// journalError is a journal that Open refuses: a whole entry that does not
// decode. It says how to recover, which is not recoverHint's way.
type journalError struct{ err error }

func (e *journalError) Error() string {
	return "damaged: " + e.err.Error() + "; the offset file itself is sound: move the journal aside to open the file " +
		"as of its last checkpoint (what was handled since then is handled again)"
}

func (e *journalError) Unwrap() []error { return []error{ErrDamaged, e.err} }

// journalGen reads the generation of db's last checkpoint; 0 if none.
func journalGen(db *bolt.DB) (uint64, error) {
	var gen uint64
	err := protect(func() error {
		return db.View(func(tx *bolt.Tx) error {
			if meta := tx.Bucket(metaBucket); meta != nil {
				if v := meta.Get(journalKey); len(v) == 8 {
					gen = binary.BigEndian.Uint64(v)
				}
			}
			return nil
		})
	})
	return gen, err
}

// replayJournal reads the journal of the file at path, open as db, and logs
// what it found.
func replayJournal(db *bolt.DB, path string, log *zap.Logger) (*journalRead, error) {
	gen, err := journalGen(db)
	if err != nil {
		return nil, err
	}
	jr, err := readJournal(path, gen)
	if err != nil {
		return nil, err
	}
	if jr.bad != nil {
		return nil, &journalError{err: jr.bad}
	}
	jr.gen = gen
	jp := zap.String("journal", path+JournalSuffix)
	if jr.entries > 0 {
		log.Info("the last run ended without a checkpoint; replayed its journal",
			jp, zap.Int("entries", jr.entries), zap.Int("records", len(jr.recs)))
	}
	if jr.torn > 0 {
		log.Warn("the journal ends in a partial entry (a write cut short by a crash of the machine); ignored",
			jp, zap.Int64("bytes", jr.torn))
	}
	if jr.stale > 0 {
		log.Info("the journal holds entries of an earlier checkpoint; ignored", jp, zap.Int("entries", jr.stale))
	}
	return jr, nil
}

// openJournal opens the journal for writing when s uses one, and folds
// what a crash left in it into the file, so that the writer starts from an
// empty journal.
func (s *Store) openJournal(jr *journalRead) error {
	if s.syncInterval > 0 {
		j, err := openJournal(s.path)
		if err != nil {
			return err
		}
		j.gen = jr.gen
		s.j = j // broken until reset: the first flush checkpoints
	}
	if len(jr.recs) > 0 {
		writes := make([]pendingWrite, 0, len(jr.recs))
		for _, k := range jr.order {
			rec := jr.recs[k]
			writes = append(writes, pendingWrite{key: k, rec: &rec})
		}
		encodeWrites(nil, writes)
		if err := s.checkpoint(writes, nil, nil, nil); err != nil {
			if s.j != nil {
				_ = s.j.close(false)
			}
			return fmt.Errorf("folding the journal into the file: %w", err)
		}
	}
	if s.j == nil && jr.exists {
		if err := os.Remove(s.path + JournalSuffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}
