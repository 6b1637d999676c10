package kafkaproxy

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// maxFrameSize bounds the size of one request or response frame. Kafka's own
// default socket.request.max.bytes is 100 MiB; responses to large fetches can
// be bigger, so the bound is generous. A larger frame ends the connection.
const maxFrameSize = 256 << 20

// errMalformed marks a frame the proxy could not parse.
var errMalformed = errors.New("malformed kafka frame")

// readFrame reads one size-prefixed Kafka frame and returns it including its
// 4-byte size prefix, so that it can be forwarded byte for byte.
func readFrame(r *bufio.Reader) ([]byte, error) {
	var size [4]byte
	if _, err := io.ReadFull(r, size[:]); err != nil {
		return nil, err
	}
	n := int32(binary.BigEndian.Uint32(size[:]))
	if n < 4 || n > maxFrameSize {
		return nil, fmt.Errorf("%w: frame size %d", errMalformed, n)
	}
	frame := make([]byte, 4+int(n))
	copy(frame, size[:])
	if _, err := io.ReadFull(r, frame[4:]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return frame, nil
}

// reqHeader is the part of a request header the proxy needs.
type reqHeader struct {
	key     int16
	version int16
	corr    int32
}

// parseRequestHeader parses the fixed part of the request header of frame
// (which includes its size prefix): api key, api version, correlation id.
func parseRequestHeader(frame []byte) (reqHeader, error) {
	if len(frame) < 12 {
		return reqHeader{}, fmt.Errorf("%w: request of %d bytes", errMalformed, len(frame))
	}
	return reqHeader{
		key:     int16(binary.BigEndian.Uint16(frame[4:])),
		version: int16(binary.BigEndian.Uint16(frame[6:])),
		corr:    int32(binary.BigEndian.Uint32(frame[8:])),
	}, nil
}

// requestBody returns the request body of frame: what follows the client id
// and, for flexible versions, the header's tagged fields. It fails for api
// keys kmsg does not know, because their header flexibility is unknown.
func requestBody(h reqHeader, frame []byte) ([]byte, error) {
	b := frame[12:]
	if h.key == int16(kmsg.ControlledShutdown) && h.version == 0 {
		return b, nil // the one request header without a client id
	}
	req := kmsg.RequestForKey(h.key)
	if req == nil {
		return nil, fmt.Errorf("%w: unknown api key %d", errMalformed, h.key)
	}
	req.SetVersion(h.version)
	if len(b) < 2 {
		return nil, fmt.Errorf("%w: short client id", errMalformed)
	}
	idLen := int(int16(binary.BigEndian.Uint16(b)))
	b = b[2:]
	if idLen > 0 {
		if idLen > len(b) {
			return nil, fmt.Errorf("%w: client id of %d bytes overruns the frame", errMalformed, idLen)
		}
		b = b[idLen:]
	}
	if req.IsFlexible() {
		n, err := tagsLen(b)
		if err != nil {
			return nil, err
		}
		b = b[n:]
	}
	return b, nil
}

// responseHeaderLen returns the length of the response header (after the
// size prefix) for a response to key at version: the correlation id, plus the
// tagged fields of flexible versions. ApiVersions responses never carry
// header tags, so that clients can parse them before knowing the version.
func responseHeaderLen(key, version int16, payload []byte) (int, error) {
	if len(payload) < 4 {
		return 0, fmt.Errorf("%w: response of %d bytes", errMalformed, len(payload))
	}
	resp := kmsg.ResponseForKey(key)
	if resp == nil || key == int16(kmsg.ApiVersions) {
		return 4, nil
	}
	resp.SetVersion(version)
	if !resp.IsFlexible() {
		return 4, nil
	}
	n, err := tagsLen(payload[4:])
	if err != nil {
		return 0, err
	}
	return 4 + n, nil
}

// tagsLen returns the number of bytes taken by the tagged-field section
// (KIP-482) at the start of b.
func tagsLen(b []byte) (int, error) {
	num, n := binary.Uvarint(b)
	if n <= 0 {
		return 0, fmt.Errorf("%w: bad tag count", errMalformed)
	}
	off := n
	for range num {
		if _, n = binary.Uvarint(b[off:]); n <= 0 {
			return 0, fmt.Errorf("%w: bad tag key", errMalformed)
		}
		off += n
		size, n := binary.Uvarint(b[off:])
		if n <= 0 || size > uint64(len(b)-off-n) {
			return 0, fmt.Errorf("%w: bad tag size", errMalformed)
		}
		off += n + int(size)
	}
	return off, nil
}

// produceAcks returns the acks field of a Produce request body. A request
// with acks=0 gets no response from the broker.
func produceAcks(version int16, body []byte) (int16, error) {
	b := body
	if version >= 3 { // transactional id precedes acks
		if version >= 9 {
			n, sz := binary.Uvarint(b)
			if sz <= 0 {
				return 0, fmt.Errorf("%w: bad transactional id", errMalformed)
			}
			b = b[sz:]
			if n > 0 {
				if n-1 > uint64(len(b)) {
					return 0, fmt.Errorf("%w: transactional id overruns the frame", errMalformed)
				}
				b = b[n-1:]
			}
		} else {
			if len(b) < 2 {
				return 0, fmt.Errorf("%w: bad transactional id", errMalformed)
			}
			n := int(int16(binary.BigEndian.Uint16(b)))
			b = b[2:]
			if n > 0 {
				if n > len(b) {
					return 0, fmt.Errorf("%w: transactional id overruns the frame", errMalformed)
				}
				b = b[n:]
			}
		}
	}
	if len(b) < 2 {
		return 0, fmt.Errorf("%w: missing acks", errMalformed)
	}
	return int16(binary.BigEndian.Uint16(b)), nil
}

// appendFrame appends a size-prefixed frame made of parts to dst.
func appendFrame(dst []byte, parts ...[]byte) []byte {
	n := 0
	for _, part := range parts {
		n += len(part)
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	for _, part := range parts {
		dst = append(dst, part...)
	}
	return dst
}

// responseFrame returns a complete response frame for resp answering the
// request with correlation id corr, with an empty header tag section where
// the version calls for one.
func responseFrame(resp kmsg.Response, corr int32) []byte {
	header := binary.BigEndian.AppendUint32(nil, uint32(corr))
	if resp.IsFlexible() && resp.Key() != int16(kmsg.ApiVersions) {
		header = append(header, 0) // no header tags
	}
	return appendFrame(nil, header, resp.AppendTo(nil))
}
