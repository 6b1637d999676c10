package testsupport

import (
	"context"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// SetGroupSession sets group's consumer-protocol session timeout and
// heartbeat interval as group configs (consumer.session.timeout.ms,
// consumer.heartbeat.interval.ms; Kafka and kfake keep them across broker
// restarts, kfake honours the session only), before the group forms: a
// consumer-protocol member takes both from the broker, not its Config.
func SetGroupSession(ctx context.Context, brokers []string, group string, session, heartbeat time.Duration) error {
	kc, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ClientID("tidemark-test-admin"))
	if err != nil {
		return fmt.Errorf("setting group %s's session: %w", group, err)
	}
	defer kc.Close()
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType, r.ResourceName = kmsg.ConfigResourceTypeGroupConfig, group
	for k, v := range map[string]time.Duration{"consumer.session.timeout.ms": session, "consumer.heartbeat.interval.ms": heartbeat} {
		c := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
		c.Name, c.Value = k, kmsg.StringPtr(fmt.Sprint(v.Milliseconds()))
		r.Configs = append(r.Configs, c)
	}
	req.Resources = append(req.Resources, r)
	res, err := req.RequestWith(ctx, kc)
	if err == nil {
		for _, rr := range res.Resources {
			if err = kerr.ErrorForCode(rr.ErrorCode); err != nil {
				if rr.ErrorMessage != nil {
					err = fmt.Errorf("%w (%s)", err, *rr.ErrorMessage)
				}
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("setting group %s's session to %s and heartbeat interval to %s: %w", group, session, heartbeat, err)
	}
	return nil
}
