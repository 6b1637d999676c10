package kafkaproxy

import (
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
)

// FetchRewriter rewrites the record batches of one partition in a Fetch
// response, as a broker could have sent them (a batch whose last records
// compaction removed, a record that does not decode): it gets the raw
// batches and returns the ones to forward.
type FetchRewriter func(topic string, partition int32, batches []byte) []byte

// OnFetch installs fn on every Fetch response from now on; nil removes it.
func (p *Proxy) OnFetch(fn FetchRewriter) {
	p.mu.Lock()
	p.onFetch = fn
	p.mu.Unlock()
}

// rewriteFetch applies fn to each partition of a Fetch response frame's
// payload (correlation id first). A response it cannot decode is forwarded
// unchanged.
func (p *Proxy) rewriteFetch(h reqHeader, payload []byte, fn FetchRewriter, log *zap.Logger) []byte {
	n, err := responseHeaderLen(h.key, h.version, payload)
	if err != nil {
		log.Warn("cannot read a fetch response header; forwarding unchanged", zap.Error(err))
		return appendFrame(nil, payload[:4], payload[4:])
	}
	resp := kmsg.NewPtrFetchResponse()
	resp.SetVersion(h.version)
	if err := resp.ReadFrom(payload[n:]); err != nil {
		log.Warn("cannot decode a fetch response; forwarding unchanged", zap.Error(err))
		return appendFrame(nil, payload[:n], payload[n:])
	}
	for i := range resp.Topics {
		t := &resp.Topics[i]
		for j := range t.Partitions {
			pt := &t.Partitions[j]
			pt.RecordBatches = fn(t.Topic, pt.Partition, pt.RecordBatches)
		}
	}
	return appendFrame(nil, payload[:n], resp.AppendTo(nil))
}
