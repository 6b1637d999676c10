package kafkaproxy

import (
	"fmt"
	"net"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"
)

// rewrites reports whether responses to key carry broker addresses that the
// proxy replaces with its own.
func rewrites(key int16) bool {
	switch kmsg.Key(key) {
	case kmsg.Metadata, kmsg.FindCoordinator, kmsg.DescribeCluster:
		return true
	}
	return false
}

// endpoint is a broker address as it appears in responses.
type endpoint struct {
	host string
	port int32
}

func (e endpoint) String() string { return net.JoinHostPort(e.host, fmt.Sprint(e.port)) }

// sameHost reports whether two host names denote the same host, treating all
// loopback names and addresses as one host.
func sameHost(a, b string) bool {
	return strings.EqualFold(a, b) || (isLoopback(a) && isLoopback(b))
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// rewriteStats counts what one rewrite did.
type rewriteStats struct {
	rewritten int // broker entries pointed at the proxy
	unmatched int // broker entries left alone: not the upstream broker
}

// rewriteResponse decodes the body of a Metadata, FindCoordinator or
// DescribeCluster response of the given version, points every entry for the
// upstream broker at the proxy, and returns the re-encoded body.
func (p *Proxy) rewriteResponse(key, version int16, body []byte) ([]byte, rewriteStats, error) {
	var st rewriteStats
	resp := kmsg.ResponseForKey(key)
	if resp == nil {
		return nil, st, fmt.Errorf("unknown api key %d", key)
	}
	if version < 0 || version > resp.MaxVersion() {
		return nil, st, fmt.Errorf("%s v%d is newer than kmsg knows (v%d)", kmsg.NameForKey(key), version, resp.MaxVersion())
	}
	resp.SetVersion(version)
	if err := resp.ReadFrom(body); err != nil {
		return nil, st, fmt.Errorf("decoding %s v%d: %w", kmsg.NameForKey(key), version, err)
	}
	fix := func(node int32, host *string, port *int32, single bool) {
		if !p.isUpstream(node, *host, *port, single) {
			st.unmatched++
			return
		}
		*host, *port = p.adv.host, p.adv.port
		st.rewritten++
	}
	switch r := resp.(type) {
	case *kmsg.MetadataResponse:
		for i := range r.Brokers {
			b := &r.Brokers[i]
			fix(b.NodeID, &b.Host, &b.Port, len(r.Brokers) == 1)
		}
	case *kmsg.DescribeClusterResponse:
		for i := range r.Brokers {
			b := &r.Brokers[i]
			fix(b.NodeID, &b.Host, &b.Port, len(r.Brokers) == 1)
		}
	case *kmsg.FindCoordinatorResponse:
		if version < 4 {
			if r.ErrorCode == 0 {
				fix(r.NodeID, &r.Host, &r.Port, false)
			}
		}
		for i := range r.Coordinators {
			c := &r.Coordinators[i]
			if c.ErrorCode == 0 {
				fix(c.NodeID, &c.Host, &c.Port, false)
			}
		}
	default:
		return nil, st, fmt.Errorf("%s responses are not rewritten", kmsg.NameForKey(key))
	}
	return resp.AppendTo(nil), st, nil
}

// isUpstream reports whether the broker entry (node, host, port) denotes the
// upstream broker: its address matches the upstream address, or it is the
// only broker of the cluster, or it carries the node id learned from such an
// entry earlier. Matching entries teach the proxy the upstream's node id.
func (p *Proxy) isUpstream(node int32, host string, port int32, single bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	match := single || (port == p.up.port && sameHost(host, p.up.host)) || (p.upNode >= 0 && node == p.upNode)
	if match && node >= 0 {
		p.upNode = node
	}
	return match
}
