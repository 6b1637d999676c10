package kafkaproxy

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// AnyKey matches requests of every api key in a rule, and selects the totals
// over all keys in Counts.
const AnyKey kmsg.Key = -1

// ErrUnsupported is returned by Fail for an api key whose error responses
// the proxy cannot synthesize; FailableKeys lists the supported ones.
var ErrUnsupported = errors.New("kafkaproxy: cannot synthesize responses for this api key")

type ruleKind uint8

const (
	ruleDelay ruleKind = iota
	ruleFail
	ruleReset
	ruleDelayResponse
)

func (k ruleKind) String() string {
	switch k {
	case ruleDelay:
		return "delay"
	case ruleFail:
		return "fail"
	case ruleDelayResponse:
		return "delay-response"
	default:
		return "reset"
	}
}

// Rule is a fault rule installed on a Proxy by Delay, Fail or ResetOn. It
// stays in force until Remove or Proxy.ClearRules.
type Rule struct {
	p     *Proxy
	key   kmsg.Key
	kind  ruleKind
	delay time.Duration
	code  int16

	every int     // act on every nth match; 1 = every match
	prob  float64 // then act with this probability
	times int     // act at most this many times; 0 = unlimited

	// guarded by p.mu
	matched int
	applied int
}

// RuleOption narrows when a rule acts on a matching request.
type RuleOption func(*Rule) error

// Every makes the rule act on every nth matching request only: the nth, the
// 2nth, and so on, counted over all connections. n must be at least 1.
func Every(n int) RuleOption {
	return func(r *Rule) error {
		if n < 1 {
			return fmt.Errorf("kafkaproxy: Every(%d): n must be at least 1", n)
		}
		r.every = n
		return nil
	}
}

// Probability makes the rule act on a matching request (one Every selects, if
// both are given) with probability p, drawn from the proxy's seeded random
// source (see WithSeed). p must be in [0, 1].
func Probability(p float64) RuleOption {
	return func(r *Rule) error {
		if !(p >= 0 && p <= 1) {
			return fmt.Errorf("kafkaproxy: Probability(%v): p must be in [0, 1]", p)
		}
		r.prob = p
		return nil
	}
}

// Times makes the rule act at most n times; after that it matches but does
// nothing. n must be at least 1.
func Times(n int) RuleOption {
	return func(r *Rule) error {
		if n < 1 {
			return fmt.Errorf("kafkaproxy: Times(%d): n must be at least 1", n)
		}
		r.times = n
		return nil
	}
}

// Delay holds each matching request (key, or AnyKey) for d before forwarding
// it. Later requests on the same connection wait behind it, so responses stay
// in order. The returned rule is in force until removed.
func (p *Proxy) Delay(key kmsg.Key, d time.Duration, opts ...RuleOption) (*Rule, error) {
	if d < 0 {
		return nil, fmt.Errorf("kafkaproxy: Delay(%s, %v): negative delay", keyName(key), d)
	}
	return p.addRule(&Rule{key: key, kind: ruleDelay, delay: d}, opts)
}

// DelayResponse forwards each matching request at once and holds the
// broker's response to it for d: the broker applies the request while the
// client, if its timeout is shorter, sees no answer (an unknown outcome).
// Later responses on the same connection wait behind it.
func (p *Proxy) DelayResponse(key kmsg.Key, d time.Duration, opts ...RuleOption) (*Rule, error) {
	if d < 0 {
		return nil, fmt.Errorf("kafkaproxy: DelayResponse(%s, %v): negative delay", keyName(key), d)
	}
	return p.addRule(&Rule{key: key, kind: ruleDelayResponse, delay: d}, opts)
}

// Fail answers each matching request itself instead of forwarding it: with a
// response of the request's version in which every error code, top-level and
// per topic, partition, group or member echoed from the request, is code.
// The response takes the request's place in the connection's response
// order. key must be one of FailableKeys (or AnyKey, which then fails only
// requests of those keys); otherwise the error wraps ErrUnsupported.
func (p *Proxy) Fail(key kmsg.Key, code int16, opts ...RuleOption) (*Rule, error) {
	if _, ok := echoes[key]; !ok && key != AnyKey {
		return nil, fmt.Errorf("kafkaproxy: Fail(%s): %w", keyName(key), ErrUnsupported)
	}
	return p.addRule(&Rule{key: key, kind: ruleFail, code: code}, opts)
}

// ResetOn closes the client connection abruptly (TCP RST) when a matching
// request arrives, without forwarding it; responses still owed on that
// connection are lost.
func (p *Proxy) ResetOn(key kmsg.Key, opts ...RuleOption) (*Rule, error) {
	return p.addRule(&Rule{key: key, kind: ruleReset}, opts)
}

func (p *Proxy) addRule(r *Rule, opts []RuleOption) (*Rule, error) {
	r.p, r.every, r.prob = p, 1, 1
	for _, o := range opts {
		if err := o(r); err != nil {
			return nil, err
		}
	}
	p.mu.Lock()
	p.rules = append(p.rules, r)
	p.mu.Unlock()
	return r, nil
}

// Remove takes the rule out of force. Requests already held by a Delay rule
// are released only when their delay ends. Removing twice is harmless.
func (r *Rule) Remove() {
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	r.p.rules = slices.DeleteFunc(r.p.rules, func(x *Rule) bool { return x == r })
}

// Applied returns how many times the rule has acted.
func (r *Rule) Applied() int {
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	return r.applied
}

// String describes the rule, for test failure messages.
func (r *Rule) String() string {
	s := fmt.Sprintf("%s %s", r.kind, keyName(r.key))
	switch r.kind {
	case ruleDelay, ruleDelayResponse:
		s += " " + r.delay.String()
	case ruleFail:
		s += fmt.Sprintf(" code=%d", r.code)
	}
	if r.every > 1 {
		s += fmt.Sprintf(" every=%d", r.every)
	}
	if r.prob < 1 {
		s += fmt.Sprintf(" p=%v", r.prob)
	}
	if r.times > 0 {
		s += fmt.Sprintf(" times=%d", r.times)
	}
	return s
}

// ClearRules removes every rule. Blackhole and Latency are not rules and
// keep their settings.
func (p *Proxy) ClearRules() {
	p.mu.Lock()
	p.rules = nil
	p.mu.Unlock()
}

// Blackhole(true) makes the proxy stop forwarding in both directions:
// connections are still accepted and requests are still read, but nothing
// reaches the broker or the clients until Blackhole(false), when the held
// traffic flows again in order.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case on && p.blackhole == nil:
		p.blackhole = make(chan struct{})
	case !on && p.blackhole != nil:
		close(p.blackhole)
		p.blackhole = nil
	}
}

// Latency holds every request for d plus a uniformly random jitter in
// [-jitter, +jitter] (never less than zero) before it is forwarded or
// answered by a rule. Latency(0, 0) turns it off; negative values count as 0.
func (p *Proxy) Latency(d, jitter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency, p.jitter = max(d, 0), max(jitter, 0)
}

// verdict is what the rules decided for one request.
type verdict struct {
	latency   time.Duration
	delay     time.Duration
	respDelay time.Duration
	fail      bool
	code      int16
	reset     bool
}

// judge applies the rules to a request of key and counts the outcome. A
// reset wins over everything; delays add up; the first Fail rule to act
// supplies the error code.
func (p *Proxy) judge(key int16) verdict {
	p.mu.Lock()
	defer p.mu.Unlock()
	var v verdict
	if p.latency > 0 || p.jitter > 0 {
		v.latency = p.latency
		if p.jitter > 0 {
			v.latency += time.Duration(p.rng.Int64N(int64(2*p.jitter)+1)) - p.jitter
		}
		v.latency = max(v.latency, 0)
	}
	_, failable := echoes[kmsg.Key(key)]
	for _, r := range p.rules {
		if r.key != AnyKey && int16(r.key) != key {
			continue
		}
		if r.kind == ruleFail && !failable {
			continue // only reachable with AnyKey
		}
		r.matched++
		if r.matched%r.every != 0 || (r.times > 0 && r.applied >= r.times) {
			continue
		}
		if r.prob < 1 && p.rng.Float64() >= r.prob {
			continue
		}
		r.applied++
		switch r.kind {
		case ruleDelay:
			v.delay += r.delay
		case ruleDelayResponse:
			v.respDelay += r.delay
		case ruleFail:
			if !v.fail {
				v.fail, v.code = true, r.code
			}
		case ruleReset:
			v.reset = true
		}
	}
	return v
}

func keyName(k kmsg.Key) string {
	if k == AnyKey {
		return "AnyKey"
	}
	if n := kmsg.NameForKey(int16(k)); n != "" && n != "Unknown" {
		return n
	}
	return fmt.Sprintf("key(%d)", int16(k))
}
