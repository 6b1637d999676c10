package wire

import (
	"context"
	"errors"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// maxIdle is how many idle connections Client keeps per broker.
const maxIdle = 2

// Client sends requests that need no connection of their own: to any broker
// (Metadata, FindCoordinator) or to one named broker (OffsetCommit,
// OffsetFetch and Produce). Every request takes an idle connection to its
// broker or dials one, so requests from different goroutines never wait for
// each other. It is safe for concurrent use; Close closes the idle
// connections.
type Client struct {
	opts  Options
	seeds []string

	mu   sync.Mutex
	next int // the seed to try first, rotating past failures
	idle map[string][]*Conn
	// suspect holds, until when, the seeds Any tries last (Suspect).
	suspect map[string]time.Time
}

// NewClient returns a Client for the cluster reached through seeds.
func NewClient(seeds []string, opts Options) *Client {
	return &Client{opts: opts, seeds: seeds, idle: map[string][]*Conn{}}
}

// Options returns what the Client dials with.
func (c *Client) Options() *Options { return &c.opts }

// Any sends req to one of the seed brokers, trying the next one when a
// broker cannot be reached. The error of the last try names every seed
// tried.
func (c *Client) Any(ctx context.Context, req kmsg.Request, timeout time.Duration) (kmsg.Response, error) {
	var errs []error
	for _, addr := range c.order() {
		res, err := c.At(ctx, addr, req, timeout)
		if err == nil {
			return res, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
		c.mu.Lock()
		if i := slices.Index(c.seeds, addr); i >= 0 && c.seeds[c.next] == addr {
			c.next = (i + 1) % len(c.seeds) // rotate past the failing seed
		}
		c.mu.Unlock()
	}
	return nil, errors.Join(errs...)
}

// order is the seeds in the order Any tries them: from next on, the
// suspect ones last.
func (c *Client) order() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	out := make([]string, 0, len(c.seeds))
	var last []string
	for i := range c.seeds {
		addr := c.seeds[(c.next+i)%len(c.seeds)]
		if until, ok := c.suspect[addr]; ok && now.Before(until) {
			last = append(last, addr)
			continue
		}
		out = append(out, addr)
	}
	return append(out, last...)
}

// Suspect makes Any try addr after the other seeds for d: a broker whose
// fetches fail, or go unanswered (one shutting down answers nothing until
// its process exits), would hold a metadata lookup as long.
func (c *Client) Suspect(addr string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.suspect == nil {
		c.suspect = map[string]time.Time{}
	}
	c.suspect[addr] = time.Now().Add(d)
}

// At sends req to the broker at addr.
func (c *Client) At(ctx context.Context, addr string, req kmsg.Request, timeout time.Duration) (kmsg.Response, error) {
	return c.AtVersion(ctx, addr, req, -1, timeout)
}

// AtVersion is At in version v (Conn.DoVersion); -1: the version Versions
// pins.
func (c *Client) AtVersion(ctx context.Context, addr string, req kmsg.Request, v int16, timeout time.Duration) (kmsg.Response, error) {
	conn, err := c.take(ctx, addr)
	if err != nil {
		return nil, err
	}
	var res kmsg.Response
	if v < 0 {
		res, err = conn.Do(ctx, req, timeout)
	} else {
		res, err = conn.DoVersion(ctx, req, v, timeout)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	c.put(conn)
	return res, nil
}

func (c *Client) take(ctx context.Context, addr string) (*Conn, error) {
	c.mu.Lock()
	if conns := c.idle[addr]; len(conns) > 0 {
		conn := conns[len(conns)-1]
		c.idle[addr] = conns[:len(conns)-1]
		c.mu.Unlock()
		return conn, nil
	}
	c.mu.Unlock()
	conn, err := Dial(ctx, addr, &c.opts)
	if err != nil {
		return nil, err
	}
	return conn, nil
}

func (c *Client) put(conn *Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle == nil || len(c.idle[conn.addr]) >= maxIdle {
		conn.Close()
		return
	}
	c.idle[conn.addr] = append(c.idle[conn.addr], conn)
}

// Close closes the idle connections; those in use close when their
// request ends.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, conns := range c.idle {
		for _, conn := range conns {
			conn.Close()
		}
	}
	c.idle = nil
}

// Addr is the "host:port" of a Metadata response's broker.
func Addr(b kmsg.MetadataResponseBroker) string {
	return net.JoinHostPort(b.Host, strconv.Itoa(int(b.Port)))
}
