package offsetfile

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
)

// A bounds-checked reader of bbolt's page tree, independent of bbolt.
//
// bbolt trusts its file: a damaged page makes it index past a slice or read
// outside its mapping, and tx.Check does so in a goroutine of its own, where
// no recover can reach. walkPages reads the file's bytes with every offset
// checked, so Open can refuse a damaged file before bbolt reads a page of
// it, and Salvage can read around the damage. It reads page by page
// (ReadAt), so a large file is not held in memory. It checks what tx.Check
// checks: page types, element bounds, key order, pages reached twice,
// freelist entries, and pages neither reachable nor free.
//
// Page layout (go.etcd.io/bbolt internal/common, native byte order): a
// 16-byte header (id uint64, flags uint16, count uint16, overflow uint32),
// then count elements of 16 bytes: a branch element is (pos, ksize uint32,
// child pgid uint64), a leaf element (flags, pos, ksize, vsize uint32), pos
// counting from the element itself. A bucket's value is (root pgid,
// sequence uint64), followed by the bucket's leaf page when root is 0
// (inline bucket). A freelist page holds count page ids (uint64); a count
// of 0xFFFF means the first uint64 is the count.

const (
	branchPageFlag   = 0x01
	leafPageFlag     = 0x02
	metaPageFlag     = 0x04
	freelistPageFlag = 0x10
	bucketLeafFlag   = 0x01
	pageElemSize     = 16
	bucketHeaderSize = 16
	// maxTreeDepth bounds the recursion on a damaged tree; a real file of
	// 4 KiB pages is a few levels deep.
	maxTreeDepth = 64
	// maxPageProblems caps the problems kept, as Check caps bbolt's.
	maxPageProblems = 100
)

// pageWalk is one pass over a file's page tree.
type pageWalk struct {
	f        io.ReaderAt
	pageSize uint64
	hwm      uint64 // pages [0, hwm) are in use
	reached  []bool
	// visit is called for every key with a value (not a bucket), with the
	// names of the buckets that hold it, outermost first; the slices stay
	// valid.
	visit    func(path [][]byte, k, v []byte)
	problems []string
	more     int // problems beyond maxPageProblems
	// hurt, if set, is called with the bucket of each problem found in
	// the tree (at, while inTree): what it held may be missing.
	hurt   func(path [][]byte)
	at     [][]byte
	inTree bool
}

func (w *pageWalk) problem(format string, args ...any) {
	if w.inTree && w.hurt != nil {
		w.hurt(w.at)
	}
	if len(w.problems) == maxPageProblems {
		w.more++
		return
	}
	w.problems = append(w.problems, fmt.Sprintf(format, args...))
}

// walkPages checks the page tree of a bbolt file of size bytes, given its
// current meta page (checkHeader), calling visit (if not nil) for every
// key-value pair it can read. It returns the problems found, at most
// maxPageProblems followed by a count of the rest; none for a sound file.
func walkPages(f io.ReaderAt, size int64, m boltMeta, visit func(path [][]byte, k, v []byte)) []string {
	return walkPagesHurt(f, size, m, visit, nil)
}

// walkPagesHurt is walkPages that also calls hurt with the bucket of every
// problem in the tree (nil for the root bucket): a bucket whose keys may
// not all have been visited.
func walkPagesHurt(f io.ReaderAt, size int64, m boltMeta, visit func(path [][]byte, k, v []byte), hurt func(path [][]byte)) []string {
	w := &pageWalk{f: f, pageSize: uint64(m.pageSize), hwm: m.pgid, visit: visit, hurt: hurt}
	if m.pageSize == 0 || w.hwm < 2 || w.hwm > uint64(size)/w.pageSize {
		if hurt != nil {
			hurt(nil)
		}
		return []string{fmt.Sprintf("file is %d bytes but its meta page uses %d pages of %d bytes", size, w.hwm, w.pageSize)}
	}
	w.reached = make([]bool, w.hwm)
	w.reached[0], w.reached[1] = true, true
	// The meta pages' checksum leaves out their page header, which bbolt
	// asserts on (a panic) when it reads them as pages.
	for id := uint64(0); id < 2; id++ {
		hdr := make([]byte, pageHeaderSize)
		if _, err := w.f.ReadAt(hdr, int64(id*w.pageSize)); err != nil {
			w.problem("meta page %d: %v", id, err)
			continue
		}
		ne := binary.NativeEndian
		if got, flags := ne.Uint64(hdr), ne.Uint16(hdr[8:]); got != id || flags != metaPageFlag {
			w.problem("meta page %d: header says page %d with flags %#x (overwritten?)", id, got, flags)
		}
	}
	free := w.freelist(m.freelist)
	w.inTree = true
	w.tree(nil, m.root, nil, nil, 0)
	w.inTree = false
	if free != nil {
		for id := uint64(2); id < w.hwm; id++ {
			switch {
			case w.reached[id] && free[id]:
				w.problem("page %d: in use and on the freelist", id)
			case !w.reached[id] && !free[id]:
				w.problem("page %d: unreachable unfreed", id)
			}
		}
	}
	if w.more > 0 {
		w.problems = append(w.problems, fmt.Sprintf("%d more problems not listed", w.more))
	}
	return w.problems
}

// page returns the bytes of page id, its overflow pages included, and its
// header's flags and count; nil and a problem recorded if it cannot be
// read.
func (w *pageWalk) page(id uint64, what string) (p []byte, flags, count uint16) {
	if id < 2 || id >= w.hwm {
		w.problem("%s: page %d out of range [2, %d)", what, id, w.hwm)
		return nil, 0, 0
	}
	ne := binary.NativeEndian
	off := int64(id * w.pageSize)
	hdr := make([]byte, w.pageSize)
	if _, err := w.f.ReadAt(hdr, off); err != nil {
		w.problem("%s: page %d: %v", what, id, err)
		return nil, 0, 0
	}
	if got := ne.Uint64(hdr); got != id {
		w.problem("%s: page %d: header says page %d (overwritten?)", what, id, got)
		return nil, 0, 0
	}
	overflow := uint64(ne.Uint32(hdr[12:]))
	if overflow >= w.hwm-id {
		w.problem("%s: page %d: %d overflow pages run past the last page in use (%d)", what, id, overflow, w.hwm-1)
		return nil, 0, 0
	}
	for i := id; i <= id+overflow; i++ {
		if w.reached[i] {
			w.problem("%s: page %d reached twice", what, i)
			return nil, 0, 0
		}
		w.reached[i] = true
	}
	p = hdr
	if overflow > 0 {
		p = make([]byte, (overflow+1)*w.pageSize)
		if _, err := w.f.ReadAt(p, off); err != nil {
			w.problem("%s: page %d: %v", what, id, err)
			return nil, 0, 0
		}
	}
	return p, ne.Uint16(hdr[8:]), ne.Uint16(hdr[10:])
}

// freelist reads the freelist pages: the set of free page ids, or nil when
// the file has no persisted freelist or it cannot be read (then pages
// neither reachable nor free go unreported).
func (w *pageWalk) freelist(id uint64) []bool {
	if id == noFreelist {
		return nil
	}
	p, flags, count := w.page(id, "freelist")
	if p == nil {
		return nil
	}
	if flags != freelistPageFlag {
		w.problem("freelist: page %d has flags %#x, not a freelist page", id, flags)
		return nil
	}
	ne := binary.NativeEndian
	body := p[pageHeaderSize:]
	n := uint64(count)
	if count == 0xFFFF {
		if len(body) < 8 {
			w.problem("freelist: page %d: count missing", id)
			return nil
		}
		n, body = ne.Uint64(body), body[8:]
	}
	if n > uint64(len(body))/8 {
		w.problem("freelist: page %d: %d free page ids do not fit in %d bytes", id, n, len(body))
		return nil
	}
	free := make([]bool, w.hwm)
	for i := range n {
		f := ne.Uint64(body[i*8:])
		switch {
		case f < 2 || f >= w.hwm:
			w.problem("freelist: free page %d out of range [2, %d)", f, w.hwm)
		case free[f]:
			w.problem("freelist: page %d freed twice", f)
		default:
			free[f] = true
		}
	}
	return free
}

// tree walks the bucket tree rooted at page id, whose keys must lie in
// [lo, hi) (nil: unbounded).
func (w *pageWalk) tree(path [][]byte, id uint64, lo, hi []byte, depth int) {
	defer w.enter(path)()
	where := bucketPath(path)
	if depth > maxTreeDepth {
		w.problem("%s: page %d: tree deeper than %d levels", where, id, maxTreeDepth)
		return
	}
	p, flags, count := w.page(id, where)
	if p == nil {
		if lo != nil || hi != nil {
			upTo := "to the last"
			if hi != nil {
				upTo = "up to (not including) " + keyName(hi)
			}
			w.problem("%s: the keys from %s %s, which page %d holds, are not read", where, keyName(lo), upTo, id)
		}
		return
	}
	switch flags {
	case branchPageFlag:
		w.branch(path, id, p, count, lo, hi, depth)
	case leafPageFlag:
		w.leaf(path, fmt.Sprintf("page %d", id), p, count, lo, hi, depth)
	default:
		w.problem("%s: page %d has flags %#x, not a branch or leaf page", where, id, flags)
	}
}

// elems reports whether the count elements of page p fit in it.
func (w *pageWalk) elems(where, page string, p []byte, count uint16) bool {
	if pageHeaderSize+int(count)*pageElemSize > len(p) {
		w.problem("%s: %s: %d elements do not fit in %d bytes", where, page, count, len(p))
		return false
	}
	return true
}

// span returns p[start:start+n] if it lies within p.
func span(p []byte, start, n uint64) ([]byte, bool) {
	if start > uint64(len(p)) || n > uint64(len(p))-start {
		return nil, false
	}
	return p[start : start+n], true
}

func (w *pageWalk) branch(path [][]byte, id uint64, p []byte, count uint16, lo, hi []byte, depth int) {
	where := bucketPath(path)
	if count == 0 {
		w.problem("%s: branch page %d has no elements", where, id)
		return
	}
	if !w.elems(where, fmt.Sprintf("page %d", id), p, count) {
		return
	}
	ne := binary.NativeEndian
	keys := make([][]byte, count)
	children := make([]uint64, count)
	for i := range uint64(count) {
		e := pageHeaderSize + i*pageElemSize
		k, ok := span(p, e+uint64(ne.Uint32(p[e:])), uint64(ne.Uint32(p[e+4:])))
		if !ok {
			w.problem("%s: page %d: branch element %d points outside the page", where, id, i)
			return
		}
		if !w.inOrder(where, fmt.Sprintf("page %d", id), i, k, keys, lo, hi) {
			return
		}
		keys[i], children[i] = k, ne.Uint64(p[e+8:])
	}
	for i, child := range children {
		next := hi
		if i+1 < len(keys) {
			next = keys[i+1]
		}
		w.tree(path, child, keys[i], next, depth+1)
	}
}

// inOrder checks key i of a page against the keys before it and the
// bounds the parent gives.
func (w *pageWalk) inOrder(where, page string, i uint64, k []byte, keys [][]byte, lo, hi []byte) bool {
	switch {
	case i > 0 && bytes.Compare(keys[i-1], k) >= 0:
		w.problem("%s: %s: keys out of order at element %d", where, page, i)
	case lo != nil && bytes.Compare(k, lo) < 0, hi != nil && bytes.Compare(k, hi) >= 0:
		w.problem("%s: %s: key of element %d outside the range its parent gives", where, page, i)
	default:
		return true
	}
	return false
}

func (w *pageWalk) leaf(path [][]byte, page string, p []byte, count uint16, lo, hi []byte, depth int) {
	where := bucketPath(path)
	if !w.elems(where, page, p, count) {
		return
	}
	ne := binary.NativeEndian
	keys := make([][]byte, count)
	for i := range uint64(count) {
		e := pageHeaderSize + i*pageElemSize
		flags, pos, ksize, vsize := ne.Uint32(p[e:]), uint64(ne.Uint32(p[e+4:])), uint64(ne.Uint32(p[e+8:])), uint64(ne.Uint32(p[e+12:]))
		kv, ok := span(p, e+pos, ksize+vsize)
		if !ok {
			w.problem("%s: %s: leaf element %d points outside the page", where, page, i)
			return
		}
		k, v := kv[:ksize], kv[ksize:]
		if !w.inOrder(where, page, i, k, keys, lo, hi) {
			return
		}
		keys[i] = k
		switch flags {
		case 0:
			if w.visit != nil {
				w.visit(path, k, v)
			}
		case bucketLeafFlag:
			w.bucket(append(path[:len(path):len(path)], k), v, depth)
		default:
			w.problem("%s: %s: leaf element %d has flags %#x", where, page, i, flags)
		}
	}
}

// bucket walks the bucket whose value is v.
func (w *pageWalk) bucket(path [][]byte, v []byte, depth int) {
	defer w.enter(path)()
	if len(v) < bucketHeaderSize {
		w.problem("%s: bucket value is %d bytes, want at least %d", bucketPath(path), len(v), bucketHeaderSize)
		return
	}
	root := binary.NativeEndian.Uint64(v)
	if root != 0 {
		w.tree(path, root, nil, nil, depth+1)
		return
	}
	// An inline bucket: its leaf page follows the header.
	p := v[bucketHeaderSize:]
	if len(p) < pageHeaderSize {
		w.problem("%s: inline bucket of %d bytes", bucketPath(path), len(v))
		return
	}
	flags, count := binary.NativeEndian.Uint16(p[8:]), binary.NativeEndian.Uint16(p[10:])
	switch {
	case flags != leafPageFlag:
		w.problem("%s: inline bucket page has flags %#x, not a leaf page", bucketPath(path), flags)
	case count > 0:
		w.leaf(path, "inline page", p, count, nil, nil, depth+1)
	}
}

// enter makes path the bucket problems are found in, until the function
// it returns is called.
func (w *pageWalk) enter(path [][]byte) func() {
	prev := w.at
	w.at = path
	return func() { w.at = prev }
}

// bucketPath names a bucket for a problem: "the root bucket", or its names
// from the outermost, quoted.
func bucketPath(path [][]byte) string {
	if len(path) == 0 {
		return "root bucket"
	}
	var b bytes.Buffer
	b.WriteString("bucket ")
	for i, name := range path {
		if i > 0 {
			b.WriteByte('/')
		}
		fmt.Fprintf(&b, "%q", truncName(name))
	}
	return b.String()
}

// keyName shows a key of this package's layout: a partition (4 bytes), a
// partition and offset (12 bytes, failure entries), or the bytes.
func keyName(k []byte) string {
	switch len(k) {
	case 0:
		return "the first"
	case 4:
		return fmt.Sprintf("partition %d", int32(binary.BigEndian.Uint32(k)))
	case 12:
		return fmt.Sprintf("partition %d offset %d", int32(binary.BigEndian.Uint32(k)), int64(binary.BigEndian.Uint64(k[4:])))
	}
	return fmt.Sprintf("%q", truncName(k))
}
