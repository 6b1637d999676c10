package framework

import (
	"context"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/wire"
)

// cluster is how the engine reaches Kafka: every request goes through
// package wire, on a connection of its owner's (a fetch loop, the group
// loop, the heartbeats) or, for requests that need none of their own
// (Metadata, FindCoordinator, OffsetCommit, OffsetFetch, Produce), through
// client. New builds it and hands it to each component that talks to Kafka;
// Run closes client. Safe for concurrent use.
type cluster struct {
	cfg    *Config
	client *wire.Client
}

func newCluster(cfg *Config) *cluster {
	return &cluster{cfg: cfg, client: wire.NewClient(cfg.Brokers, wireOptions(cfg))}
}

// wireOptions are the connections' settings from cfg.
func wireOptions(cfg *Config) wire.Options {
	return wire.Options{ClientID: cfg.ClientID, TLS: cfg.TLS, SASL: cfg.SASL, Timeout: cfg.Timeout}
}

// dial opens a connection of the caller's own to the broker at addr.
func (cl *cluster) dial(ctx context.Context, addr string) (*wire.Conn, error) {
	return wire.Dial(ctx, addr, cl.client.Options())
}

// metadata reads topics' metadata from any broker, creating none.
func (cl *cluster) metadata(ctx context.Context, topics []string) (*kmsg.MetadataResponse, error) {
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	req.AllowAutoTopicCreation = false
	mctx, cancel := context.WithTimeout(ctx, cl.cfg.Timeout)
	defer cancel()
	res, err := cl.client.Any(mctx, req, cl.cfg.Timeout)
	if err != nil {
		return nil, fmt.Errorf("metadata from %s: %w", strings.Join(cl.cfg.Brokers, ","), err)
	}
	return res.(*kmsg.MetadataResponse), nil
}
