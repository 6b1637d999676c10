package tidemark_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zapcore"

	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// A subscribed topic that does not exist (a typo: "paymnts") is visible: one
// warning naming it, however many partition watches pass; Ready and
// /readyz fail naming it; Stats.MissingTopics and the status page list it.
// Created, it is consumed at the next partition watch, and every sign
// clears. Before, the consumer joined with 0 partitions, /readyz answered
// 200 and nothing was logged.
func TestMissingTopicIsVisible(t *testing.T) {
	const parts, perPart = 2, 50
	cl := testsupport.Start(t)
	topic, group := cl.FixedName(t, "paymnts"), testsupport.Name(t, "g")
	rec := &testsupport.Recorder{}
	log, logs := testsupport.ObservedLogger(t, zapcore.WarnLevel)
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	cfg.Logger = log
	r := frameworktest.Start(t, cfg)

	testsupport.WaitFor(t, 30*time.Second, "Ready failing, naming the topic", func() bool {
		err := r.C.Ready()
		return err != nil && strings.Contains(err.Error(), topic) && r.C.Stats().Generation > 0
	})
	if got := r.C.Stats().MissingTopics; !slices.Equal(got, []string{topic}) {
		t.Errorf("Stats.MissingTopics = %q, want [%q]", got, topic)
	}
	if body := frameworktest.Status(t, r.C, "/readyz"); !strings.Contains(body, topic) {
		t.Errorf("/readyz body %q does not name %s", body, topic)
	}
	if page := frameworktest.Status(t, r.C, "/status"); !strings.Contains(page, `id="missing-topics"`) || !strings.Contains(page, topic) {
		t.Error("the status page does not show the missing topic")
	}
	time.Sleep(6 * time.Second) // past a partition watch (5 s): still one warning
	warned := 0
	for _, e := range logs.All() {
		if strings.Contains(fmt.Sprint(e.ContextMap()["missing_topics"]), topic) {
			warned++
		}
	}
	if warned != 1 {
		t.Errorf("%d warnings name the missing topic, want 1", warned)
	}

	cl.CreateTopic(t, topic, parts)
	created := time.Now()
	cl.Produce(t, topic, parts, 0, perPart)
	testsupport.WaitFor(t, 30*time.Second, "the created topic consumed", func() bool { return rec.Count() == parts*perPart })
	t.Logf("the topic consumed %s after it was created", time.Since(created).Round(time.Millisecond))
	testsupport.WaitForNoError(t, 10*time.Second, "Ready", r.C.Ready)
	if got := r.C.Stats().MissingTopics; len(got) != 0 {
		t.Errorf("Stats.MissingTopics = %q once the topic exists, want none", got)
	}
	r.Stop(t)
	testsupport.ExactlyOnce(t, rec, testsupport.Offsets(parts, 0), testsupport.Offsets(parts, perPart))
}
