package kafkaproxy

import (
	"fmt"
	"time"

	"go.uber.org/zap"
)

type config struct {
	listenAddr  string
	logger      *zap.Logger
	seed        uint64
	dialTimeout time.Duration
}

func defaultConfig() config {
	return config{
		listenAddr:  "127.0.0.1:0",
		logger:      zap.NewNop(),
		seed:        1,
		dialTimeout: 10 * time.Second,
	}
}

// Option configures a Proxy in New.
type Option func(*config) error

// WithListenAddr sets the address to listen on; the default is
// "127.0.0.1:0", a free loopback port. If the host is unspecified (":0",
// "0.0.0.0:0"), responses advertise the proxy as 127.0.0.1.
func WithListenAddr(addr string) Option {
	return func(c *config) error {
		if addr == "" {
			return fmt.Errorf("kafkaproxy: WithListenAddr: empty address")
		}
		c.listenAddr = addr
		return nil
	}
}

// WithLogger sets the logger; nil, the default, logs nothing. The proxy logs
// connections at debug level and protocol trouble at warn level.
func WithLogger(l *zap.Logger) Option {
	return func(c *config) error {
		if l == nil {
			l = zap.NewNop()
		}
		c.logger = l
		return nil
	}
}

// WithSeed seeds the random source behind Probability and Latency jitter, so
// that a run can be repeated; the default seed is 1.
func WithSeed(seed uint64) Option {
	return func(c *config) error {
		c.seed = seed
		return nil
	}
}

// WithDialTimeout bounds each connection attempt to the upstream broker; the
// default is 10 s. A client whose upstream connection fails is disconnected.
func WithDialTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d <= 0 {
			return fmt.Errorf("kafkaproxy: WithDialTimeout(%v): must be positive", d)
		}
		c.dialTimeout = d
		return nil
	}
}
