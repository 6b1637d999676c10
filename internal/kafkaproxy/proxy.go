package kafkaproxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Proxy is a Kafka-protocol-aware TCP proxy in front of one broker. Its
// methods are safe for concurrent use, including while traffic flows.
type Proxy struct {
	cfg    config
	log    *zap.Logger
	ln     net.Listener
	up     endpoint // upstream broker, as given to New
	upAddr string
	adv    endpoint // the proxy's own address, as advertised in responses

	ctx    context.Context // cancelled by Close; bounds upstream dials
	cancel context.CancelFunc
	wg     sync.WaitGroup // accept loop and every connection's goroutines

	closeOnce sync.Once
	closeErr  error

	mu        sync.Mutex
	closed    bool
	conns     map[*conn]struct{}
	nextConn  uint64
	rules     []*Rule
	rng       *rand.Rand
	blackhole chan struct{} // non-nil while blackholed; closed to release
	latency   time.Duration
	jitter    time.Duration
	upNode    int32 // upstream broker's node id, -1 until learned
	stats     Stats
	onFetch   FetchRewriter
}

// New starts a proxy for the Kafka broker at upstream ("host:port") and
// returns once it listens. It starts one goroutine accepting connections and
// four per client connection (client reader, upstream reader, request
// forwarder, response writer); Close ends them all. The upstream broker is
// dialled once per client connection, when the client connects.
func New(upstream string, opts ...Option) (*Proxy, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if err := o(&cfg); err != nil {
			return nil, err
		}
	}
	up, err := parseEndpoint(upstream)
	if err != nil {
		return nil, fmt.Errorf("kafkaproxy: upstream %q: %w", upstream, err)
	}
	ln, err := net.Listen("tcp", cfg.listenAddr)
	if err != nil {
		return nil, fmt.Errorf("kafkaproxy: listen: %w", err)
	}
	adv, err := parseEndpoint(ln.Addr().String())
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("kafkaproxy: listen address: %w", err)
	}
	if ip := net.ParseIP(adv.host); ip != nil && ip.IsUnspecified() {
		adv.host = "127.0.0.1"
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		cfg:    cfg,
		log:    cfg.logger.Named("kafkaproxy").With(zap.String("upstream", upstream), zap.String("addr", adv.String())),
		ln:     ln,
		up:     up,
		upAddr: upstream,
		adv:    adv,
		ctx:    ctx,
		cancel: cancel,
		conns:  make(map[*conn]struct{}),
		rng:    defaultRand(cfg.seed),
		upNode: -1,
	}
	p.wg.Add(1)
	go p.acceptLoop()
	p.log.Debug("listening")
	return p, nil
}

func defaultRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

func parseEndpoint(addr string) (endpoint, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return endpoint{}, err
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return endpoint{}, fmt.Errorf("bad port %q", port)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return endpoint{host: host, port: int32(n)}, nil
}

// Addr returns the proxy's address, "host:port", to bootstrap clients with.
func (p *Proxy) Addr() string { return p.adv.String() }

// Upstream returns the broker address given to New.
func (p *Proxy) Upstream() string { return p.upAddr }

// Close stops listening, closes every connection, and returns after every
// goroutine the proxy started has exited. Calls after the first return nil.
func (p *Proxy) Close() error {
	first := false
	p.closeOnce.Do(func() {
		first = true
		p.mu.Lock()
		p.closed = true
		conns := make([]*conn, 0, len(p.conns))
		for c := range p.conns {
			conns = append(conns, c)
		}
		p.mu.Unlock()
		if err := p.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			p.closeErr = fmt.Errorf("kafkaproxy: close listener: %w", err)
		}
		p.cancel()
		for _, c := range conns {
			c.teardown(false)
		}
		p.wg.Wait()
		p.log.Debug("closed")
	})
	if !first {
		return nil
	}
	return p.closeErr
}

// ResetAll closes every current client connection abruptly (TCP RST) along
// with its upstream connection. New connections are accepted as usual.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	conns := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.teardown(true)
	}
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	var backoff time.Duration
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Like net/http: back off on transient errors such as EMFILE.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			p.log.Warn("accept failed", zap.Error(err), zap.Duration("backoff", backoff))
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-p.ctx.Done():
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			nc.Close()
			return
		}
		p.nextConn++
		c := newConn(p, p.nextConn, nc)
		p.conns[c] = struct{}{}
		p.stats.Accepted++
		p.wg.Add(1)
		p.mu.Unlock()
		go c.serve()
	}
}

func (p *Proxy) forget(c *conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// blackholed returns the channel to wait on while the proxy is blackholed,
// or nil if it is not.
func (p *Proxy) blackholed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.blackhole
}
