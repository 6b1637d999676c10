package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// The replay section counts the offset file's writes: every fsync-ed write
// of tidemark's offset file is one bbolt transaction, and bbolt numbers its
// transactions in the file's two meta pages (the newer one holds the last
// committed id). Reading them costs two small reads, without opening the
// database (tidemark holds its lock).

// bbolt's on-disk layout (format version 2): a page header of 16 bytes
// (id, flags, count, overflow), then the meta: magic, version, page size,
// flags (4 bytes each), the root bucket (16), the freelist and high-water
// page ids (8 each), the transaction id (8) and an FNV-64a checksum of the
// meta before it (8). Integers in the machine's byte order (bbolt writes
// its structs as they lie in memory).
const (
	boltMagic       = 0xED0CDAED
	boltVersion     = 2
	boltMetaStart   = 16
	boltPageSizeAt  = boltMetaStart + 8
	boltTxIDAt      = boltMetaStart + 48
	boltChecksumAt  = boltMetaStart + 56
	boltMetaEnd     = boltChecksumAt + 8
	boltMinPageSize = 1024
)

// fileTxID returns the id of the last transaction committed to the bbolt
// file at path: the larger id of its two meta pages whose checksum holds
// (a meta page being written when read fails its checksum).
func fileTxID(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	first := make([]byte, boltMetaEnd)
	if _, err := io.ReadFull(f, first); err != nil {
		return 0, fmt.Errorf("%s: reading the first meta page: %w", path, err)
	}
	best, ok := int64(-1), false
	if id, valid := boltMeta(first); valid {
		best, ok = id, true
	}
	// The second meta page starts at the page size, which the first one
	// tells; if the first is torn, try the usual sizes.
	sizes := []int64{int64(binary.NativeEndian.Uint32(first[boltPageSizeAt:]))}
	if !ok {
		sizes = []int64{4096, 16384, 65536}
	}
	second := make([]byte, boltMetaEnd)
	for _, size := range sizes {
		if size < boltMinPageSize {
			continue
		}
		if _, err := f.ReadAt(second, size); err != nil {
			continue
		}
		if id, valid := boltMeta(second); valid {
			best, ok = max(best, id), true
			break
		}
	}
	if !ok {
		return 0, errors.New(path + ": no valid bbolt meta page")
	}
	return best, nil
}

// boltMeta decodes a meta page's transaction id, and whether the page is a
// valid meta page (magic, version and checksum).
func boltMeta(page []byte) (int64, bool) {
	ne := binary.NativeEndian
	if ne.Uint32(page[boltMetaStart:]) != boltMagic || ne.Uint32(page[boltMetaStart+4:]) != boltVersion {
		return 0, false
	}
	h := fnv.New64a()
	h.Write(page[boltMetaStart:boltChecksumAt])
	if h.Sum64() != ne.Uint64(page[boltChecksumAt:]) {
		return 0, false
	}
	return int64(ne.Uint64(page[boltTxIDAt:])), true
}
