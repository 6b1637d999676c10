package kafkaproxy

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// Queue depths per connection. Kafka clients keep few requests in flight per
// connection (kafka-go one to a few, the Java client five by default), so
// these rarely fill; when they do, reading from the peer pauses.
const (
	requestQueue  = 64
	responseQueue = 64
	pendingQueue  = 256
)

// conn is one client connection and its upstream connection.
type conn struct {
	p      *Proxy
	log    *zap.Logger
	client net.Conn
	ctx    context.Context // done once the connection is torn down
	cancel context.CancelFunc

	mu       sync.Mutex
	upstream net.Conn
	dead     bool
}

// request is a frame read from the client with its parsed header.
type request struct {
	h     reqHeader
	frame []byte
}

// pending is the answer owed to the client for one request, in request
// order: either a synthesized frame or the next upstream response.
type pending struct {
	synthetic []byte
	h         reqHeader     // of the forwarded request, if synthetic is nil
	delay     time.Duration // hold the response this long (DelayResponse)
}

func newConn(p *Proxy, id uint64, client net.Conn) *conn {
	ctx, cancel := context.WithCancel(p.ctx)
	return &conn{
		p:      p,
		log:    p.log.With(zap.Uint64("conn", id), zap.String("client", client.RemoteAddr().String())),
		client: client,
		ctx:    ctx,
		cancel: cancel,
	}
}

// serve runs the connection: it dials the broker, starts the client reader,
// upstream reader and response writer, and forwards requests itself until
// the connection is torn down; then it waits for the three.
func (c *conn) serve() {
	defer c.p.wg.Done()
	defer c.p.forget(c)
	defer c.teardown(false)
	c.log.Debug("accepted")

	d := net.Dialer{Timeout: c.p.cfg.dialTimeout}
	up, err := d.DialContext(c.ctx, "tcp", c.p.upAddr)
	if err != nil {
		if c.ctx.Err() == nil {
			c.log.Warn("dialling upstream failed; dropping client", zap.Error(err))
		}
		return
	}
	if !c.setUpstream(up) {
		up.Close()
		return
	}

	requests := make(chan request, requestQueue)
	responses := make(chan []byte, responseQueue)
	owed := make(chan pending, pendingQueue)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); c.readClient(requests) }()
	go func() { defer wg.Done(); c.readUpstream(up, responses) }()
	go func() { defer wg.Done(); c.writeResponses(owed, responses) }()
	c.forward(up, requests, owed)
	c.teardown(false)
	wg.Wait()
	c.log.Debug("closed")
}

func (c *conn) setUpstream(up net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return false
	}
	c.upstream = up
	return true
}

// teardown closes both sides of the connection, abruptly (RST) towards the
// client if reset is set, and releases every goroutine waiting on it. Only
// the first call has an effect.
func (c *conn) teardown(reset bool) {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return
	}
	c.dead = true
	up := c.upstream
	c.mu.Unlock()

	c.cancel()
	if reset {
		if tc, ok := c.client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close sends RST instead of FIN
		}
	}
	c.client.Close()
	if up != nil {
		up.Close()
	}
}

// readClient reads request frames from the client until it disconnects.
func (c *conn) readClient(out chan<- request) {
	defer close(out)
	br := bufio.NewReaderSize(c.client, 64<<10)
	for {
		frame, err := readFrame(br)
		if err == nil {
			var h reqHeader
			if h, err = parseRequestHeader(frame); err == nil {
				c.p.count(h.key, Counts{Seen: 1})
				select {
				case out <- request{h: h, frame: frame}:
					continue
				case <-c.ctx.Done():
					return
				}
			}
		}
		if c.ctx.Err() == nil {
			if errors.Is(err, errMalformed) {
				c.log.Warn("bad request from client; closing", zap.Error(err))
			} else {
				c.log.Debug("client gone", zap.Error(err))
			}
		}
		c.teardown(false)
		return
	}
}

// readUpstream reads response frames from the broker until it disconnects.
func (c *conn) readUpstream(up net.Conn, out chan<- []byte) {
	br := bufio.NewReaderSize(up, 64<<10)
	for {
		frame, err := readFrame(br)
		if err != nil {
			if c.ctx.Err() == nil {
				if errors.Is(err, errMalformed) {
					c.log.Warn("bad response from upstream; closing", zap.Error(err))
				} else {
					c.log.Debug("upstream gone", zap.Error(err))
				}
			}
			c.teardown(false)
			return
		}
		select {
		case out <- frame:
		case <-c.ctx.Done():
			return
		}
	}
}

// forward applies the fault rules to each request in order and forwards it,
// answers it, or resets the connection.
func (c *conn) forward(up net.Conn, in <-chan request, owed chan<- pending) {
	for {
		var r request
		select {
		case rr, ok := <-in:
			if !ok {
				return
			}
			r = rr
		case <-c.ctx.Done():
			return
		}
		h := r.h
		v := c.p.judge(h.key)
		if !c.sleep(v.latency) {
			return
		}
		if v.reset {
			c.p.count(h.key, Counts{Reset: 1})
			c.log.Debug("reset by rule", zap.String("api", kmsg.NameForKey(h.key)))
			c.teardown(true)
			return
		}
		if v.delay > 0 {
			c.p.count(h.key, Counts{Delayed: 1})
			if !c.sleep(v.delay) {
				return
			}
		}
		if !c.waitBlackhole() {
			return
		}

		answered := true // whether the broker answers this request
		if kmsg.Key(h.key) == kmsg.Produce {
			if body, err := requestBody(h, r.frame); err == nil {
				if acks, err := produceAcks(h.version, body); err == nil && acks == 0 {
					answered = false
				}
			}
		}

		var p pending
		if v.fail {
			c.p.count(h.key, Counts{Failed: 1})
			if !answered {
				continue // the client expects no answer: dropping it is the failure
			}
			out, err := synthesize(h, r.frame, v.code)
			if err != nil {
				c.log.Error("cannot synthesize error response; resetting instead",
					zap.String("api", kmsg.NameForKey(h.key)), zap.Int16("version", h.version), zap.Error(err))
				c.p.count(h.key, Counts{Reset: 1})
				c.teardown(true)
				return
			}
			p.synthetic = out
		} else {
			p.h = h
			if v.respDelay > 0 {
				c.p.count(h.key, Counts{Delayed: 1})
				p.delay = v.respDelay
			}
		}
		if p.synthetic != nil || answered {
			select {
			case owed <- p:
			case <-c.ctx.Done():
				return
			}
		}
		if p.synthetic != nil {
			continue
		}
		c.p.count(h.key, Counts{Forwarded: 1}) // before the write, so the count leads the response
		if _, err := up.Write(r.frame); err != nil {
			if c.ctx.Err() == nil {
				c.log.Debug("writing to upstream failed", zap.Error(err))
			}
			c.teardown(false)
			return
		}
	}
}

// writeResponses writes the answers owed to the client in request order,
// taking the broker's responses from in.
func (c *conn) writeResponses(owed <-chan pending, in <-chan []byte) {
	for {
		var p pending
		select {
		case p = <-owed:
		case <-c.ctx.Done():
			return
		}
		out := p.synthetic
		if out == nil {
			select {
			case out = <-in:
			case <-c.ctx.Done():
				return
			}
			var err error
			if out, err = c.p.inspectResponse(p.h, out, c.log); err != nil {
				c.log.Warn("bad response from upstream; closing", zap.Error(err))
				c.teardown(false)
				return
			}
		}
		if p.delay > 0 && !c.sleep(p.delay) {
			return
		}
		if !c.waitBlackhole() {
			return
		}
		if _, err := c.client.Write(out); err != nil {
			if c.ctx.Err() == nil {
				c.log.Debug("writing to client failed", zap.Error(err))
			}
			c.teardown(false)
			return
		}
	}
}

// inspectResponse checks that frame answers the request h and rewrites
// broker addresses in it where needed. Responses that cannot be rewritten
// are counted, logged and returned unchanged.
func (p *Proxy) inspectResponse(h reqHeader, frame []byte, log *zap.Logger) ([]byte, error) {
	payload := frame[4:]
	if corr := int32(binary.BigEndian.Uint32(payload)); corr != h.corr {
		return nil, fmt.Errorf("%w: response correlation id %d, expected %d (%s v%d)",
			errMalformed, corr, h.corr, kmsg.NameForKey(h.key), h.version)
	}
	if h.key == int16(kmsg.Fetch) {
		p.mu.Lock()
		fn := p.onFetch
		p.mu.Unlock()
		if fn != nil {
			return p.rewriteFetch(h, payload, fn, log), nil
		}
	}
	if !rewrites(h.key) {
		return frame, nil
	}
	n, err := responseHeaderLen(h.key, h.version, payload)
	var body []byte
	var st rewriteStats
	if err == nil {
		body, st, err = p.rewriteResponse(h.key, h.version, payload[n:])
	}
	p.mu.Lock()
	if err != nil {
		p.stats.RewriteErrors++
	}
	p.stats.Rewritten += int64(st.rewritten)
	p.stats.Unmatched += int64(st.unmatched)
	p.mu.Unlock()
	if err != nil {
		log.Warn("cannot rewrite broker addresses; forwarding unchanged", zap.Error(err))
		return frame, nil
	}
	if st.unmatched > 0 {
		log.Warn("response names brokers other than the upstream; clients may bypass the proxy",
			zap.String("api", kmsg.NameForKey(h.key)), zap.Int("unmatched", st.unmatched))
	}
	return appendFrame(nil, payload[:n], body), nil
}

// sleep waits for d, or until the connection is torn down (then false).
func (c *conn) sleep(d time.Duration) bool {
	if d <= 0 {
		return c.ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.ctx.Done():
		return false
	}
}

// waitBlackhole waits while the proxy is blackholed; false if the connection
// was torn down meanwhile.
func (c *conn) waitBlackhole() bool {
	for {
		ch := c.p.blackholed()
		if ch == nil {
			return c.ctx.Err() == nil
		}
		select {
		case <-ch:
		case <-c.ctx.Done():
			return false
		}
	}
}
