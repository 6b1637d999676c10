package kafkaproxy

import (
	"maps"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// Counts counts requests of one api key (or of all, for AnyKey).
type Counts struct {
	Seen      int64 // requests read from clients
	Forwarded int64 // requests written to the broker
	Delayed   int64 // requests held by a Delay rule
	Failed    int64 // requests answered by a Fail rule instead of the broker
	Reset     int64 // connections reset by a ResetOn rule on such a request
}

func (c *Counts) add(o Counts) {
	c.Seen += o.Seen
	c.Forwarded += o.Forwarded
	c.Delayed += o.Delayed
	c.Failed += o.Failed
	c.Reset += o.Reset
}

// Stats is a snapshot of a Proxy's counters since New.
type Stats struct {
	Accepted int64 // client connections accepted
	Open     int   // client connections open now
	// Rewritten counts broker entries in Metadata, FindCoordinator and
	// DescribeCluster responses that were pointed at the proxy.
	Rewritten int64
	// Unmatched counts broker entries in those responses that were left
	// alone because they did not denote the upstream broker: a client
	// following one would bypass the proxy.
	Unmatched int64
	// RewriteErrors counts such responses that could not be decoded and were
	// forwarded unchanged.
	RewriteErrors int64
	Keys          map[kmsg.Key]Counts // per api key; keys never seen are absent
}

// Stats returns a snapshot of the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Open = len(p.conns)
	s.Keys = maps.Clone(p.stats.Keys)
	if s.Keys == nil {
		s.Keys = map[kmsg.Key]Counts{}
	}
	return s
}

// Counts returns the counters of one api key, or the totals over all keys for
// AnyKey.
func (p *Proxy) Counts(key kmsg.Key) Counts {
	p.mu.Lock()
	defer p.mu.Unlock()
	if key != AnyKey {
		return p.stats.Keys[key]
	}
	var total Counts
	for _, c := range p.stats.Keys {
		total.add(c)
	}
	return total
}

// count adds d to the counters of key.
func (p *Proxy) count(key int16, d Counts) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stats.Keys == nil {
		p.stats.Keys = make(map[kmsg.Key]Counts)
	}
	c := p.stats.Keys[kmsg.Key(key)]
	c.add(d)
	p.stats.Keys[kmsg.Key(key)] = c
}
