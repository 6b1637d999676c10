package framework

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	"github.com/segmentio/kafka-go/protocol/apiversions"
	"github.com/segmentio/kafka-go/protocol/fetch"
	"github.com/segmentio/kafka-go/protocol/saslauthenticate"
	"github.com/segmentio/kafka-go/protocol/saslhandshake"
	"github.com/segmentio/kafka-go/sasl"
)

// fetchVersion is the Fetch request version tidemark speaks: the last one
// without flexible encoding (Kafka 2.3 and later; Kafka 4.x accepts v4 and
// up). Its response carries the log start offset, the last stable offset
// and per-partition errors.
const fetchVersion = 11

// brokerConn is one connection to one broker, used for Fetch requests only,
// one request at a time. kafka-go's protocol package encodes the request; the
// response is read here into one buffer that the decoded messages slice
// into, so that record batches are decoded once, with their last offset
// delta (see records.go), and without kafka-go's per-record allocations.
//
// A brokerConn is owned by its broker's fetch loop (fetch.go); nothing else
// touches it.
type brokerConn struct {
	addr     string
	nc       net.Conn
	pc       *protocol.Conn
	clientID string
	corr     int32
}

// dialBroker connects to addr with the Consumer's TLS and SASL settings and
// checks that the broker speaks fetchVersion.
func dialBroker(ctx context.Context, cfg *Config, addr string) (*brokerConn, error) {
	d := net.Dialer{Timeout: cfg.Timeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dialing broker %s: %w", addr, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = nc.Close()
		}
	}()
	deadline := time.Now().Add(cfg.Timeout)
	if d, has := ctx.Deadline(); has && d.Before(deadline) {
		deadline = d
	}
	_ = nc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	if cfg.TLS != nil {
		tc := cfg.TLS
		if tc.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			tc = tc.Clone()
			tc.ServerName = host
		}
		tlsConn := tls.Client(nc, tc)
		if err := tlsConn.HandshakeContext(ctx); err != nil {
			return nil, fmt.Errorf("TLS handshake with broker %s: %w", addr, err)
		}
		nc = tlsConn
	}
	pc := protocol.NewConn(nc, cfg.ClientID)
	msg, err := pc.RoundTrip(new(apiversions.Request))
	if err != nil {
		return nil, fmt.Errorf("API versions of broker %s: %w", addr, err)
	}
	res := msg.(*apiversions.Response)
	if res.ErrorCode != 0 {
		return nil, fmt.Errorf("API versions of broker %s: %w", addr, kafka.Error(res.ErrorCode))
	}
	versions := make(map[protocol.ApiKey]int16, len(res.ApiKeys))
	fetchOK := false
	for _, k := range res.ApiKeys {
		key := protocol.ApiKey(k.ApiKey)
		versions[key] = key.SelectVersion(k.MinVersion, k.MaxVersion)
		if key == protocol.Fetch && k.MinVersion <= fetchVersion && k.MaxVersion >= fetchVersion {
			fetchOK = true
		}
	}
	if !fetchOK {
		return nil, fmt.Errorf("broker %s does not support Fetch v%d (Kafka 2.3 or later is needed)", addr, fetchVersion)
	}
	pc.SetVersions(versions)
	if cfg.SASL != nil {
		host, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		sctx := sasl.WithMetadata(ctx, &sasl.Metadata{Host: host, Port: p})
		if err := authenticate(sctx, pc, cfg.SASL); err != nil {
			return nil, fmt.Errorf("SASL %s with broker %s: %w", cfg.SASL.Name(), addr, err)
		}
	}
	_ = nc.SetDeadline(time.Time{})
	ok = true
	return &brokerConn{addr: addr, nc: nc, pc: pc, clientID: cfg.ClientID}, nil
}

// authenticate runs the SASL handshake and exchange on a new connection.
func authenticate(ctx context.Context, pc *protocol.Conn, mech sasl.Mechanism) error {
	msg, err := pc.RoundTrip(&saslhandshake.Request{Mechanism: mech.Name()})
	if err != nil {
		return err
	}
	if code := msg.(*saslhandshake.Response).ErrorCode; code != 0 {
		return kafka.Error(code)
	}
	sess, state, err := mech.Start(ctx)
	if err != nil {
		return err
	}
	for done := false; !done; {
		msg, err := pc.RoundTrip(&saslauthenticate.Request{AuthBytes: state})
		if err != nil {
			if errors.Is(err, io.EOF) {
				return kafka.SASLAuthenticationFailed
			}
			return err
		}
		res := msg.(*saslauthenticate.Response)
		if res.ErrorCode != 0 {
			return fmt.Errorf("%w: %s", kafka.Error(res.ErrorCode), res.ErrorMessage)
		}
		if done, state, err = sess.Next(ctx, res.AuthBytes); err != nil {
			return err
		}
	}
	return nil
}

func (c *brokerConn) close() { _ = c.nc.Close() }

// fetchResult is one partition of a Fetch response. records holds the raw
// record batches; it slices into the response buffer.
type fetchResult struct {
	topic     string
	partition int32
	err       kafka.Error // 0 when none
	hwm       int64
	logStart  int64
	records   []byte
}

// fetch sends req and reads its response. ctx interrupts the exchange; the
// connection is unusable after any error. The results slice into one
// buffer holding the whole response.
func (c *brokerConn) fetch(ctx context.Context, req *fetch.Request, timeout time.Duration) ([]fetchResult, int, error) {
	_ = c.nc.SetDeadline(time.Now().Add(timeout))
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c.corr++
	if err := protocol.WriteRequest(c.pc, fetchVersion, c.corr, c.clientID, req); err != nil {
		return nil, 0, c.ioErr(ctx, "sending a fetch", err)
	}
	buf, err := c.readResponse(ctx, "fetch", 1<<30)
	if err != nil {
		return nil, 0, err
	}
	res, err := parseFetchResponse(buf)
	if err != nil {
		return nil, 0, fmt.Errorf("fetch response from broker %s: %w", c.addr, err)
	}
	return res, len(buf), nil
}

// readResponse reads the answer to the request last sent (c.corr): its body
// after the correlation id, of at most limit bytes.
func (c *brokerConn) readResponse(ctx context.Context, what string, limit int32) ([]byte, error) {
	var head [8]byte
	if _, err := io.ReadFull(c.pc, head[:]); err != nil {
		return nil, c.ioErr(ctx, "reading a "+what+" response", err)
	}
	size := int32(binary.BigEndian.Uint32(head[:4]))
	if corr := int32(binary.BigEndian.Uint32(head[4:])); corr != c.corr {
		return nil, fmt.Errorf("%s response from broker %s: correlation id %d, want %d", what, c.addr, corr, c.corr)
	}
	if size < 4 || size > limit {
		return nil, fmt.Errorf("%s response from broker %s: invalid size %d", what, c.addr, size)
	}
	buf := make([]byte, size-4)
	if _, err := io.ReadFull(c.pc, buf); err != nil {
		return nil, c.ioErr(ctx, "reading a "+what+" response", err)
	}
	return buf, nil
}

func (c *brokerConn) ioErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%s on broker %s: %w", what, c.addr, err)
}

// parseFetchResponse reads a Fetch v11 response body (after the correlation
// id).
func parseFetchResponse(b []byte) ([]fetchResult, error) {
	r := wireReader{b: b}
	r.int32() // throttle time
	if code := r.int16(); code != 0 && r.err == nil {
		return nil, fmt.Errorf("fetch failed: %w", kafka.Error(code))
	}
	r.int32() // session id
	var out []fetchResult
	for nt := r.arrayLen(); nt > 0 && r.err == nil; nt-- {
		topic := r.string()
		for np := r.arrayLen(); np > 0 && r.err == nil; np-- {
			fr := fetchResult{topic: topic}
			fr.partition = r.int32()
			fr.err = kafka.Error(r.int16())
			fr.hwm = r.int64()
			r.int64() // last stable offset
			fr.logStart = r.int64()
			for na := r.arrayLen(); na > 0 && r.err == nil; na-- {
				r.int64() // producer id
				r.int64() // first offset
			}
			r.int32() // preferred read replica
			fr.records = r.bytes()
			out = append(out, fr)
		}
	}
	if r.err != nil {
		return nil, r.err
	}
	return out, nil
}

// wireReader reads Kafka's fixed-width big-endian encoding; the first
// error sticks and later reads return zero values.
type wireReader struct {
	b   []byte
	err error
}

var errShort = errors.New("truncated")

func (r *wireReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = errShort
		return nil
	}
	s := r.b[:n:n]
	r.b = r.b[n:]
	return s
}

func (r *wireReader) int16() int16 {
	if s := r.take(2); s != nil {
		return int16(binary.BigEndian.Uint16(s))
	}
	return 0
}

func (r *wireReader) int32() int32 {
	if s := r.take(4); s != nil {
		return int32(binary.BigEndian.Uint32(s))
	}
	return 0
}

func (r *wireReader) int64() int64 {
	if s := r.take(8); s != nil {
		return int64(binary.BigEndian.Uint64(s))
	}
	return 0
}

func (r *wireReader) arrayLen() int {
	n := r.int32()
	if n < 0 {
		return 0
	}
	if int(n) > len(r.b) { // every element takes at least a byte
		r.err = errShort
		return 0
	}
	return int(n)
}

// string reads a string; a nullable one's null (-1) reads as "".
func (r *wireReader) string() string {
	n := r.int16()
	if n < 0 {
		return ""
	}
	return string(r.take(int(n)))
}

func (r *wireReader) bytes() []byte {
	n := r.int32()
	if n < 0 {
		return nil
	}
	return r.take(int(n))
}
