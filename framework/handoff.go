package framework

import (
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// Completed ranges carried to a partition's next owner in the metadata of
// its offset commits. With OrderKey and OrderNone a partition completes
// offsets above its watermark; the committed offset is the watermark, so
// a next owner on another machine would handle those offsets again. Each
// commit carries the ranges the offset file proves done above the offset
// committed, as parallel-consumer does; a next owner without a file of its
// own as current starts at the committed offset and passes them over.
//
// The metadata is "tidemark:1:" and the base64 (URL alphabet, no padding)
// of uvarints: the number of ranges, then for each range its gap from the
// end of the one before (from the committed offset for the first; at
// least 1) and its length (at least 1). Kafka bounds a commit's metadata
// (offset.metadata.max.bytes, 4,096 by default): the ranges that do not fit
// in maxHandoffMeta are left out, and the next owner handles them again.

const (
	handoffPrefix = "tidemark:1:"
	// maxHandoffMeta keeps a commit's metadata under Kafka's default bound
	// of 4,096 bytes.
	maxHandoffMeta = 4000
)

// encodeHandoff returns the metadata carrying ranges, the completed ranges
// above offset, and how many offsets it had to leave out. Ranges at or
// below offset are dropped (they are below the commit: done anyway).
func encodeHandoff(offset int64, ranges []offsetfile.Range) (meta string, omitted int64) {
	const maxBin = (maxHandoffMeta - len(handoffPrefix)) * 3 / 4
	body := make([]byte, 0, 64)
	n, prev := 0, offset
	for i, r := range ranges {
		if r.To <= prev+1 {
			continue
		}
		from := max(r.From, prev+1)
		var tmp [2 * binary.MaxVarintLen64]byte
		k := binary.PutUvarint(tmp[:], uint64(from-prev))
		k += binary.PutUvarint(tmp[k:], uint64(r.To-from))
		// The count's uvarint grows by at most one byte as ranges are added.
		if len(body)+k+binary.MaxVarintLen64 > maxBin {
			for _, rest := range ranges[i:] {
				omitted += rest.To - max(rest.From, prev+1)
			}
			break
		}
		body = append(body, tmp[:k]...)
		n, prev = n+1, r.To
	}
	if n == 0 {
		return "", omitted
	}
	out := binary.AppendUvarint(make([]byte, 0, len(body)+binary.MaxVarintLen64), uint64(n))
	return handoffPrefix + base64.RawURLEncoding.EncodeToString(append(out, body...)), omitted
}

// errNotHandoff: the metadata is not ours (empty, or another client's).
var errNotHandoff = errors.New("not tidemark's metadata")

// decodeHandoff returns the completed ranges meta carries above offset:
// sorted, disjoint, not touching, each above offset. Metadata that is not
// tidemark's returns errNotHandoff; ours that does not decode, another
// error: the caller then restores nothing.
func decodeHandoff(offset int64, meta string) ([]offsetfile.Range, error) {
	enc, ok := strings.CutPrefix(meta, handoffPrefix)
	if !ok {
		return nil, errNotHandoff
	}
	if offset < 0 {
		return nil, fmt.Errorf("completed ranges above no committed offset (%d)", offset)
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return nil, fmt.Errorf("completed ranges: %w", err)
	}
	next := func() (uint64, error) {
		v, k := binary.Uvarint(b)
		if k <= 0 {
			return 0, errors.New("completed ranges: truncated")
		}
		b = b[k:]
		return v, nil
	}
	n, err := next()
	if err != nil {
		return nil, err
	}
	if n > uint64(len(b)/2) {
		return nil, fmt.Errorf("completed ranges: %d ranges in %d bytes", n, len(b))
	}
	out := make([]offsetfile.Range, 0, n)
	prev := offset
	for range n {
		gap, err := next()
		if err != nil {
			return nil, err
		}
		length, err := next()
		if err != nil {
			return nil, err
		}
		const limit = 1 << 62 // far past any offset: no sum below overflows
		if gap == 0 || length == 0 || gap > limit || length > limit || uint64(prev) > limit-gap-length {
			return nil, fmt.Errorf("completed ranges: range %d: gap %d, length %d after %d", len(out), gap, length, prev)
		}
		from := prev + int64(gap)
		out = append(out, offsetfile.Range{From: from, To: from + int64(length)})
		prev = from + int64(length)
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("completed ranges: %d bytes after the last range", len(b))
	}
	return out, nil
}

// handedOver returns the ranges to restore for p, starting at Kafka's
// committed offset C: own, what the offset file restores, with the ranges
// the commit's metadata carries above C. Both are proven done: own by
// this file, the carried ones by the file of the owner that committed
// them. Metadata that does not decode is logged and ignored.
func (a *assignment) handedOver(p *partition, log partitionLog, C int64, own []offsetfile.Range) []offsetfile.Range {
	carried, err := decodeHandoff(C, p.committedMeta)
	switch {
	case errors.Is(err, errNotHandoff):
		return own
	case err != nil:
		log.get().Warn("the committed offset's metadata does not decode; its completed ranges are handled again",
			zap.Int64("kafka_committed", C), zap.Error(err))
		return own
	}
	var n int64
	for _, r := range carried {
		n += r.To - r.From
	}
	log.get().Info("resuming with the ranges the last commit carried as completed above it: not handled again",
		zap.Int64("kafka_committed", C), zap.Int("ranges", len(carried)), zap.Int64("offsets", n))
	return unionRanges(C, own, carried)
}

// unionRanges merges two lists of completed ranges above watermark into
// sorted, disjoint, not touching ones.
func unionRanges(watermark int64, a, b []offsetfile.Range) []offsetfile.Range {
	if len(a) == 0 {
		return b
	}
	all := slices.Concat(a, b)
	slices.SortFunc(all, func(x, y offsetfile.Range) int { return cmp.Compare(x.From, y.From) })
	out := all[:0]
	for _, r := range all {
		r.From = max(r.From, watermark+1)
		switch {
		case r.From >= r.To:
		case len(out) > 0 && r.From <= out[len(out)-1].To:
			out[len(out)-1].To = max(out[len(out)-1].To, r.To)
		default:
			out = append(out, r)
		}
	}
	return out
}
