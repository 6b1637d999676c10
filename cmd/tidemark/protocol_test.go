package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// inspect names the running consumer's group protocol: with "consumer"
// (KIP-848) its member epoch, with "classic" its generation; the same in
// --json (group_protocol, member_epoch).
func TestLiveGroupProtocol(t *testing.T) {
	cl := testsupport.Start(t, kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": "250"}))
	for _, protocol := range []string{framework.GroupProtocolConsumer, framework.GroupProtocolClassic} {
		t.Run(protocol, func(t *testing.T) {
			topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
			cl.CreateTopic(t, topic, 2)
			file := filepath.Join(t.TempDir(), "offsets.db")
			cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }))
			if protocol == framework.GroupProtocolConsumer {
				cfg.GroupProtocol = protocol
				cfg.SessionTimeout, cfg.HeartbeatInterval = 0, 0
			}
			c := frameworktest.Start(t, cfg)
			testsupport.WaitFor(t, 30*time.Second, "both partitions running", func() bool {
				n := 0
				for _, p := range c.C.Stats().Partitions {
					if p.State == framework.StateRunning {
						n++
					}
				}
				return n == 2
			})
			st := c.C.Stats()
			want := fmt.Sprintf("protocol classic, generation %d,", st.Generation)
			if protocol == framework.GroupProtocolConsumer {
				if st.MemberEpoch <= 0 || st.MemberEpoch != st.Generation {
					t.Fatalf("Stats: member epoch %d, generation %d; want the same epoch above 0", st.MemberEpoch, st.Generation)
				}
				want = `protocol consumer \(KIP-848\), member epoch [0-9]+,`
			} else if st.MemberEpoch != 0 {
				t.Errorf("Stats.MemberEpoch %d with the classic protocol, want 0", st.MemberEpoch)
			}
			r := tidemark(t, "inspect", file).want(t, 0, "consumer: group "+group)
			if !regexp.MustCompile(want).MatchString(r.stdout) {
				t.Errorf("inspect does not say %q:\n%s", want, r.stdout)
			}
			r = tidemark(t, "inspect", file, "--json").want(t, 0)
			var doc struct {
				GroupProtocol string `json:"group_protocol"`
				MemberEpoch   int32  `json:"member_epoch"`
				Generation    int32  `json:"generation"`
			}
			if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
				t.Fatal(err)
			}
			if doc.GroupProtocol != protocol || (protocol == framework.GroupProtocolConsumer) != (doc.MemberEpoch > 0) || doc.Generation <= 0 {
				t.Errorf("inspect --json: group_protocol %q, member_epoch %d, generation %d", doc.GroupProtocol, doc.MemberEpoch, doc.Generation)
			}
			if strings.Contains(r.stdout, `"member_epoch": 0`) {
				t.Error("inspect --json lists member_epoch 0")
			}
			c.Stop(t)
		})
	}
}
