package wire

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// A Fetch response is read as it arrives, its partitions' record batches
// into slabs of at most 1 MiB rather than into one buffer for the whole
// answer. The partitions slice their batches (zero-copy), and one buffer
// stayed in memory until the last of its partitions, up to a few thousand,
// had handled its part; a slab is shared by a few dozen at most, so what is
// fetched leaves memory about as its partitions handle it. A partition's
// part larger than a slab takes the rest of the answer in one buffer, as
// before: an answer for a few partitions is handled at once, and one buffer
// per part cost 9% more CPU at 8 partitions (the heap shrank sooner, and
// the GC ran more often). The result is the kmsg.FetchResponse that kmsg
// would decode from the same bytes (FuzzFetchStream), for the versions
// before 12 (no tagged fields).

// errMalformed is a Fetch response that does not parse: too short for its
// fields, or an array longer than what is left could hold.
var errMalformed = errors.New("not enough data for its fields")

// fetchReader reads the fields of one response body of left bytes.
type fetchReader struct {
	r    *bufio.Reader
	left int64  // bytes of the body not read yet
	err  error  // the first error; every read after it returns zeros
	slab []byte // what is left of the slab records are read into
}

// next returns the body's next n bytes (n at most the buffer's size),
// valid until the next read.
func (f *fetchReader) next(n int) []byte {
	if f.err != nil {
		return nil
	}
	if int64(n) > f.left {
		f.err = errMalformed
		return nil
	}
	b, err := f.r.Peek(n)
	if err != nil {
		f.err = err
		return nil
	}
	_, _ = f.r.Discard(n)
	f.left -= int64(n)
	return b
}

func (f *fetchReader) int16() int16 {
	if b := f.next(2); b != nil {
		return int16(binary.BigEndian.Uint16(b))
	}
	return 0
}

func (f *fetchReader) int32() int32 {
	if b := f.next(4); b != nil {
		return int32(binary.BigEndian.Uint32(b))
	}
	return 0
}

func (f *fetchReader) int64() int64 {
	if b := f.next(8); b != nil {
		return int64(binary.BigEndian.Uint64(b))
	}
	return 0
}

// slabSize bounds what one partition's record batches keep in memory,
// unless they are larger.
const slabSize = 1 << 20

// string reads a string: its length (int16), then its bytes.
func (f *fetchReader) string() string {
	n := int(f.int16())
	if !f.fits(n) {
		return ""
	}
	return string(f.fill(make([]byte, n)))
}

// records reads a partition's record batches: their length (int32, -1 for
// null), then the bytes, into the slab, or a new one: of at most slabSize,
// or the rest of the body when they are larger.
func (f *fetchReader) records() []byte {
	n := int(f.int32())
	if f.err != nil || n < 0 {
		return nil
	}
	if !f.fits(n) {
		return nil
	}
	if n == 0 {
		return []byte{} // not nil: an empty value is not a null
	}
	if n > len(f.slab) {
		size := min(int64(slabSize), f.left)
		if n > slabSize {
			size = f.left
		}
		f.slab = make([]byte, size)
	}
	var b []byte
	b, f.slab = f.slab[:n:n], f.slab[n:]
	return f.fill(b)
}

// fits says whether n bytes can follow, and marks the body malformed when
// they cannot (n < 0 included).
func (f *fetchReader) fits(n int) bool {
	if f.err == nil && (n < 0 || int64(n) > f.left) {
		f.err = errMalformed
	}
	return f.err == nil
}

// fill reads len(b) bytes into b, which fits checked.
func (f *fetchReader) fill(b []byte) []byte {
	if _, err := io.ReadFull(f.r, b); err != nil {
		f.err = err
		return nil
	}
	f.left -= int64(len(b))
	return b
}

// arrayLen reads an array's length, refused when the elements, at least
// min bytes each, could not fit in what is left (kmsg's own bound); 0
// after an error.
func (f *fetchReader) arrayLen(min int64) int32 {
	l := f.int32()
	if f.err == nil && int64(l)*min > f.left {
		f.err = errMalformed
	}
	if f.err != nil {
		return 0
	}
	return l
}

// grown is s with room for n elements, at most maxPrealloc: arrays grow as
// their elements arrive, so that a length a hostile broker sends sizes no
// allocation beyond the bytes it actually sent (the body's size, checked
// by arrayLen, is only claimed until it is read).
func grown[T any](s []T, n int32) []T {
	if n <= 0 {
		return s
	}
	return slices.Grow(s, min(int(n), maxPrealloc))
}

const maxPrealloc = 1024

// readFetch fills res, of a version below 12, from the body of left bytes
// that r holds, reading all of it.
func readFetch(r *bufio.Reader, left int64, res *kmsg.FetchResponse) error {
	v := res.Version
	f := &fetchReader{r: r, left: left}
	if v >= 1 {
		res.ThrottleMillis = f.int32()
	}
	if v >= 7 {
		res.ErrorCode = f.int16()
		res.SessionID = f.int32()
	}
	nt := f.arrayLen(2)
	res.Topics = grown(res.Topics, nt)
	for range max(nt, 0) {
		res.Topics = append(res.Topics, kmsg.NewFetchResponseTopic())
		t := &res.Topics[len(res.Topics)-1]
		t.Topic = f.string()
		partMin := int64(16)
		if v >= 11 {
			partMin = 37
		}
		np := f.arrayLen(partMin)
		t.Partitions = grown(t.Partitions, np)
		for range max(np, 0) {
			t.Partitions = append(t.Partitions, kmsg.NewFetchResponseTopicPartition())
			p := &t.Partitions[len(t.Partitions)-1]
			p.Partition = f.int32()
			p.ErrorCode = f.int16()
			p.HighWatermark = f.int64()
			if v >= 4 {
				p.LastStableOffset = f.int64()
			}
			if v >= 5 {
				p.LogStartOffset = f.int64()
			}
			if v >= 4 {
				na := f.arrayLen(16)
				if na == 0 {
					p.AbortedTransactions = []kmsg.FetchResponseTopicPartitionAbortedTransaction{}
				}
				p.AbortedTransactions = grown(p.AbortedTransactions, na)
				for range max(na, 0) {
					a := kmsg.NewFetchResponseTopicPartitionAbortedTransaction()
					a.ProducerID = f.int64()
					a.FirstOffset = f.int64()
					p.AbortedTransactions = append(p.AbortedTransactions, a)
				}
			}
			if v >= 11 {
				p.PreferredReadReplica = f.int32()
			}
			p.RecordBatches = f.records()
			if f.err != nil {
				return f.err
			}
		}
		if f.err != nil {
			return f.err
		}
	}
	if f.err != nil {
		return f.err
	}
	// Bytes after the last field are ignored, as kmsg does; read, so that
	// the next response starts where it should.
	if _, err := r.Discard(int(f.left)); err != nil {
		return err
	}
	return nil
}

// readFetch reads the body of n bytes of a Fetch response into res.
func (c *Conn) readFetch(ctx context.Context, res *kmsg.FetchResponse, n int64) error {
	err := readFetch(c.br, n, res)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errMalformed):
		return fmt.Errorf("Fetch response from broker %s: %w", c.addr, err)
	default:
		return c.ioErr(ctx, "reading the Fetch response", err)
	}
}

// fetchBuffer is a connection's read buffer for Fetch responses: a
// partition's batches larger than it are read into their own allocation
// directly, the fields around them through it.
const fetchBuffer = 64 << 10
