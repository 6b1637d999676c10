package wire

import (
	"bufio"
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
	"github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Options are what a connection needs besides its address.
type Options struct {
	ClientID string
	TLS      *tls.Config    // nil: plaintext
	SASL     sasl.Mechanism // nil: none
	// Timeout bounds the dial and the handshake (TLS, ApiVersions, SASL).
	Timeout time.Duration
}

// Conn is one connection to one broker, one request at a time. It is not
// safe for concurrent use: each Conn is owned by one goroutine (a fetch
// loop, the group loop, the heartbeats, the committer), which closes it.
// After any error but a Kafka error code in a response, the connection is
// unusable: close it and dial again.
type Conn struct {
	addr     string
	nc       net.Conn
	format   *kmsg.RequestFormatter
	corr     int32
	versions map[int16][2]int16 // the broker's [min, max] per API key
	buf      []byte             // the request being written
	// br reads the responses: a small one in one read(2) with its size
	// and header (reading them apart took three, where franz-go takes two:
	// 6% more syscalls than the rest of a consumer at 400 msgs/s). Made at
	// the first response; a Fetch response's is fetchBuffer bytes.
	br *bufio.Reader
}

// Dial connects to addr with opts' TLS and SASL, and reads which versions
// the broker accepts.
func Dial(ctx context.Context, addr string, opts *Options) (*Conn, error) {
	d := net.Dialer{Timeout: opts.Timeout}
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
	deadline := time.Now().Add(opts.Timeout)
	if d, has := ctx.Deadline(); has && d.Before(deadline) {
		deadline = d
	}
	_ = nc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if opts.TLS != nil {
		tc := opts.TLS
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
	c := &Conn{addr: addr, nc: nc, format: kmsg.NewRequestFormatter(kmsg.FormatterClientID(opts.ClientID))}
	// ApiVersions v0: every broker answers it, whatever it supports.
	res, err := c.roundTrip(ctx, &kmsg.ApiVersionsRequest{Version: 0})
	if err != nil {
		return nil, fmt.Errorf("API versions of broker %s: %w", addr, err)
	}
	av := res.(*kmsg.ApiVersionsResponse)
	if err := Error(av.ErrorCode); err != nil {
		return nil, fmt.Errorf("API versions of broker %s: %w", addr, err)
	}
	c.versions = make(map[int16][2]int16, len(av.ApiKeys))
	for _, k := range av.ApiKeys {
		c.versions[k.ApiKey] = [2]int16{k.MinVersion, k.MaxVersion}
	}
	if !c.Supports(kmsg.Fetch) {
		return nil, fmt.Errorf("broker %s does not support Fetch v%d (Kafka 2.3 or later is needed)", addr, Versions[kmsg.Fetch])
	}
	if opts.SASL != nil {
		host, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		sctx := sasl.WithMetadata(ctx, &sasl.Metadata{Host: host, Port: p})
		if err := c.authenticate(sctx, opts.SASL); err != nil {
			return nil, fmt.Errorf("SASL %s with broker %s: %w", opts.SASL.Name(), addr, err)
		}
	}
	_ = nc.SetDeadline(time.Time{})
	ok = true
	return c, nil
}

// Addr is the broker's address.
func (c *Conn) Addr() string { return c.addr }

// Close closes the connection.
func (c *Conn) Close() { _ = c.nc.Close() }

// Supports reports whether the broker accepts the version of key that
// Versions pins.
func (c *Conn) Supports(key kmsg.Key) bool {
	v, ok := Versions[key]
	return ok && c.SupportsVersion(key, v)
}

// SupportsVersion reports whether the broker accepts version v of key.
func (c *Conn) SupportsVersion(key kmsg.Key, v int16) bool {
	r, has := c.versions[int16(key)]
	return has && r[0] <= v && v <= r[1]
}

// Do sends req in the version Versions pins for it and returns the
// response, within timeout; ctx interrupts it. A Kafka error code in the
// response is the caller's to read; an error returned here means the
// connection is unusable.
func (c *Conn) Do(ctx context.Context, req kmsg.Request, timeout time.Duration) (kmsg.Response, error) {
	key := kmsg.Key(req.Key())
	v, ok := Versions[key]
	if !ok {
		return nil, fmt.Errorf("broker %s: %s has no pinned version", c.addr, key.Name())
	}
	return c.DoVersion(ctx, req, v, timeout)
}

// DoVersion is Do in version v, for the APIs whose version is the caller's
// to pin: those that depend on the group protocol (the consumer group
// protocol's heartbeat, and the commits and offset reads that carry its
// member epoch).
func (c *Conn) DoVersion(ctx context.Context, req kmsg.Request, v int16, timeout time.Duration) (kmsg.Response, error) {
	key := kmsg.Key(req.Key())
	if !c.SupportsVersion(key, v) {
		r := c.versions[int16(key)]
		return nil, fmt.Errorf("broker %s does not support %s v%d (it accepts v%d-v%d)", c.addr, key.Name(), v, r[0], r[1])
	}
	req.SetVersion(v)
	_ = c.nc.SetDeadline(time.Now().Add(timeout))
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	res, err := c.roundTrip(ctx, req)
	if err != nil {
		return nil, err
	}
	return res, nil
}

// maxResponse bounds a response's size: a larger one is a corrupt frame.
const maxResponse = 1 << 30

// roundTrip writes req, in the version it carries, and reads its response.
func (c *Conn) roundTrip(ctx context.Context, req kmsg.Request) (kmsg.Response, error) {
	key := kmsg.Key(req.Key())
	c.corr++
	c.buf = c.format.AppendRequest(c.buf[:0], req, c.corr)
	if _, err := c.nc.Write(c.buf); err != nil {
		return nil, c.ioErr(ctx, "sending "+key.Name(), err)
	}
	if cap(c.buf) > 1<<20 {
		c.buf = nil // do not keep a large request's buffer
	}
	res := req.ResponseKind()
	fr, fetch := res.(*kmsg.FetchResponse)
	fetch = fetch && !res.IsFlexible()
	br := c.reader(fetch)
	var head [8]byte
	if _, err := io.ReadFull(br, head[:]); err != nil {
		return nil, c.ioErr(ctx, "reading the "+key.Name()+" response", err)
	}
	size := int32(binary.BigEndian.Uint32(head[:4]))
	if corr := int32(binary.BigEndian.Uint32(head[4:])); corr != c.corr {
		return nil, fmt.Errorf("%s response from broker %s: correlation id %d, want %d", key.Name(), c.addr, corr, c.corr)
	}
	if size < 4 || size > maxResponse {
		return nil, fmt.Errorf("%s response from broker %s: invalid size %d", key.Name(), c.addr, size)
	}
	if fetch {
		if err := c.readFetch(ctx, fr, int64(size-4)); err != nil { // fetchstream.go
			return nil, err
		}
		return fr, nil
	}
	body := make([]byte, size-4)
	if _, err := io.ReadFull(br, body); err != nil {
		return nil, c.ioErr(ctx, "reading the "+key.Name()+" response", err)
	}
	// A flexible response's header ends with tagged fields; ApiVersions'
	// header never has them (a client reads it before it knows versions).
	if res.IsFlexible() && key != kmsg.ApiVersions {
		var err error
		if body, err = skipTags(body); err != nil {
			return nil, fmt.Errorf("%s response from broker %s: header: %w", key.Name(), c.addr, err)
		}
	}
	if err := res.ReadFrom(body); err != nil {
		return nil, fmt.Errorf("%s response from broker %s: %w", key.Name(), c.addr, err)
	}
	return res, nil
}

// reader is the connection's reader, of fetchBuffer bytes for a Fetch
// response, else at least readBuffer. Between responses it holds nothing
// (a broker answers only what was asked, and each response is read to its
// end), so a larger one can replace it.
func (c *Conn) reader(fetch bool) *bufio.Reader {
	size := readBuffer
	if fetch {
		size = fetchBuffer
	}
	if c.br == nil || c.br.Size() < size {
		c.br = bufio.NewReaderSize(c.nc, size)
	}
	return c.br
}

// readBuffer is a connection's read buffer until its first Fetch response.
const readBuffer = 4 << 10

var errShort = errors.New("truncated")

// skipTags skips a tagged-field section: a count, then per field a tag, a
// size and that many bytes, all unsigned varints but the bytes.
func skipTags(b []byte) ([]byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, errShort
	}
	b = b[k:]
	for ; n > 0; n-- {
		if _, k = binary.Uvarint(b); k <= 0 {
			return nil, errShort
		}
		b = b[k:]
		size, k := binary.Uvarint(b)
		if k <= 0 || size > uint64(len(b)-k) {
			return nil, errShort
		}
		b = b[k+int(size):]
	}
	return b, nil
}

func (c *Conn) ioErr(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%s on broker %s: %w", what, c.addr, err)
}

// authenticate runs the SASL handshake and exchange.
func (c *Conn) authenticate(ctx context.Context, mech sasl.Mechanism) error {
	res, err := c.roundTrip(ctx, &kmsg.SASLHandshakeRequest{Version: Versions[kmsg.SASLHandshake], Mechanism: mech.Name()})
	if err != nil {
		return err
	}
	if err := Error(res.(*kmsg.SASLHandshakeResponse).ErrorCode); err != nil {
		return err
	}
	sess, state, err := mech.Start(ctx)
	if err != nil {
		return err
	}
	for done := false; !done; {
		res, err := c.roundTrip(ctx, &kmsg.SASLAuthenticateRequest{Version: Versions[kmsg.SASLAuthenticate], SASLAuthBytes: state})
		if err != nil {
			if errors.Is(err, io.EOF) {
				return kafka.SASLAuthenticationFailed
			}
			return err
		}
		ar := res.(*kmsg.SASLAuthenticateResponse)
		if err := Error(ar.ErrorCode); err != nil {
			msg := ""
			if ar.ErrorMessage != nil {
				msg = *ar.ErrorMessage
			}
			return fmt.Errorf("%w: %s", err, msg)
		}
		if done, state, err = sess.Next(ctx, ar.SASLAuthBytes); err != nil {
			return err
		}
	}
	return nil
}

// Error is nil for code 0, else the kafka.Error of the code; one that
// kafka-go's table lacks (the consumer group protocol's 110-113, and later
// ones) is named from franz-go's and still matches its kafka.Error with
// errors.Is.
func Error(code int16) error {
	if code == 0 {
		return nil
	}
	if e := kafka.Error(code); e.Title() != "" {
		return e
	}
	return namedError{code: kafka.Error(code), kerr: kerr.ErrorForCode(code)}
}

// namedError is a Kafka error code kafka-go has no name for.
type namedError struct {
	code kafka.Error
	kerr error // franz-go's, a *kerr.Error, or kerr.UnknownServerError for a code it lacks too
}

func (e namedError) Error() string {
	if ke, ok := e.kerr.(*kerr.Error); ok && ke.Code == int16(e.code) {
		return fmt.Sprintf("[%d] %s: %s", int16(e.code), ke.Message, ke.Description)
	}
	return fmt.Sprintf("[%d] unknown Kafka error code", int16(e.code))
}

func (e namedError) Unwrap() error { return e.code }
