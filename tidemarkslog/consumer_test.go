package tidemarkslog_test

import (
	"encoding/json"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
	"github.com/tidemark/tidemark/tidemarkslog"
)

// A Consumer whose Config.Logger is Logger(slog) logs through the slog
// handler: its lines are JSON with slog's levels, its logger's name, its
// With fields (the group) and typed fields (the generation a number, the
// committed flag a bool).
func TestConsumerLogsThroughSlog(t *testing.T) {
	const parts, perPart = 2, 20
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	rec := &testsupport.Recorder{}
	group := testsupport.Name(t, "g")
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
	var buf syncBuffer
	cfg.Logger = tidemarkslog.Logger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, time.Minute, "everything handled", func() bool { return rec.Count() == parts*perPart })
	r.Stop(t)

	byMsg := map[string][]map[string]any{}
	levels := map[any]int{}
	for _, l := range buf.lines(t) {
		byMsg[l["msg"].(string)] = append(byMsg[l["msg"].(string)], l)
		levels[l["level"]]++
	}
	t.Logf("%d messages logged, by level %v", len(byMsg), levels)
	if levels["DEBUG"] == 0 || levels["INFO"] == 0 {
		t.Errorf("levels logged %v, want DEBUG and INFO lines at least", levels)
	}
	joined := byMsg["generation joined"]
	if len(joined) == 0 {
		t.Fatalf("no %q line among %d messages", "generation joined", len(byMsg))
	}
	j := joined[0]
	if j["level"] != "INFO" || j["logger"] != "tidemark" || j["group"] != group {
		t.Errorf("generation joined: level %v, logger %v, group %v; want INFO, tidemark, %s", j["level"], j["logger"], j["group"], group)
	}
	if _, ok := j["generation"].(json.Number); !ok {
		t.Errorf("generation joined: generation = %s, want a JSON number", js(j["generation"]))
	}
	revoked := byMsg["partitions revoked"]
	if len(revoked) == 0 {
		t.Fatalf("no %q line", "partitions revoked")
	}
	last := revoked[len(revoked)-1]
	if last["committed"] != true || last["reason"] != "shutdown" || !jsonEqual(last["count"], json.Number("2")) {
		t.Errorf("partitions revoked at the stop: committed %s, reason %s, count %s; want true, \"shutdown\", 2",
			js(last["committed"]), js(last["reason"]), js(last["count"]))
	}
	running := byMsg["partition running"]
	if len(running) != parts {
		t.Fatalf("%d %q lines, want %d", len(running), "partition running", parts)
	}
	for _, l := range running {
		if l["level"] != "DEBUG" || l["topic"] != topic {
			t.Errorf("partition running: level %v, topic %v; want DEBUG, %s", l["level"], l["topic"], topic)
		}
		if _, ok := l["partition"].(json.Number); !ok {
			t.Errorf("partition running: partition = %s, want a JSON number", js(l["partition"]))
		}
	}
}
