package tidemark_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/kafkaproxy"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// Keys a line about a partition must not use instead of "topic",
// "partition" and "offset".
var altKeys = []string{"tp", "t", "p", "o", "part", "off", "offs", "topic_partition", "topicPartition", "topic_name",
	"partition_id", "partitionId", "partitionID", "kafka_topic", "kafka_partition", "kafka_offset", "msg_offset",
	"message_offset", "watermark"}

// Every log line about a partition carries topic and partition, and its
// offset where there is one, under the same names and types everywhere
// (issue 12): a consumer goes through a retried message, a message stopped
// by the Stop policy and resumed, a pause and resume, a failed commit and a
// graceful stop, logging at debug level into an observer; every entry that
// has "partition" or "offset" has "topic" (a string) and "partition" (an
// integer), "offset" is an integer, and no entry uses another key for them.
func TestLogFields(t *testing.T) {
	const parts, perPart = 2, 30
	cl, topic := newTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	core, logs := observer.New(zapcore.DebugLevel)
	var retried, stopping atomic.Bool
	stopping.Store(true)
	rec := newRecorder()
	rec.before = func(_ context.Context, m kafka.Message) error {
		switch {
		case m.Partition == 0 && m.Offset == 3 && !retried.Swap(true):
			return errors.New("transient")
		case m.Partition == 1 && m.Offset == 5 && stopping.Load():
			return errors.New("poison")
		}
		return nil
	}
	cfg := baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "offsets.db"), rec)
	cfg.Logger = zap.New(zapcore.NewTee(testLogger(t).Core(), core))
	cfg.Failure = framework.FailurePolicy{Action: framework.Stop, MaxAttempts: 2}
	fail, err := cl.Proxy.Fail(kmsg.OffsetCommit, 15, kafkaproxy.Times(2))
	if err != nil {
		t.Fatal(err)
	}
	defer fail.Remove()
	r := startConsumer(t, cfg)
	waitFor(t, time.Minute, "partition 1 stopped", func() bool {
		for _, p := range r.c.Stats().Partitions {
			if p.Partition == 1 && p.State == framework.StateStopped {
				return true
			}
		}
		return false
	})
	stopping.Store(false)
	if err := r.c.Pause(topic, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.c.Resume(topic, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.c.Resume(topic, 1); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "everything handled", func() bool { return rec.count() == parts*perPart })
	r.stop(t)

	for _, msg := range []string{"handler succeeded after retries", "message stopped by the failure policy (it holds its partition, or with OrderKey its key); call Consumer.Resume to try it again",
		"partition resumed; trying the message again", "partition paused", "partition resumed", "partition running", "partition stopped", "partitions revoked"} {
		if logs.FilterMessage(msg).Len() == 0 {
			t.Errorf("no %q line: the scenario did not run through it", msg)
		}
	}
	withPartition := 0
	for _, e := range logs.All() {
		fields := map[string]zapcore.Field{}
		for _, f := range e.Context {
			fields[f.Key] = f
		}
		for _, k := range altKeys {
			if _, ok := fields[k]; ok {
				t.Errorf("%q uses the key %q: use \"topic\", \"partition\" or \"offset\"", e.Message, k)
			}
		}
		_, hasPart := fields["partition"]
		_, hasOff := fields["offset"]
		if !hasPart && !hasOff {
			continue
		}
		withPartition++
		if f, ok := fields["topic"]; !ok || f.Type != zapcore.StringType {
			t.Errorf("%q has a partition or an offset but no string \"topic\" field: %v", e.Message, keys(e.Context))
		}
		if f, ok := fields["partition"]; !ok || !isInt(f) {
			t.Errorf("%q has a topic and an offset but no integer \"partition\" field: %v", e.Message, keys(e.Context))
		}
		if f, ok := fields["offset"]; ok && !isInt(f) {
			t.Errorf("%q: \"offset\" is not an integer (type %v)", e.Message, f.Type)
		}
	}
	t.Logf("%d log lines, %d of them about a partition", logs.Len(), withPartition)
}

func isInt(f zapcore.Field) bool {
	switch f.Type {
	case zapcore.Int64Type, zapcore.Int32Type, zapcore.Int16Type, zapcore.Int8Type,
		zapcore.Uint64Type, zapcore.Uint32Type, zapcore.Uint16Type, zapcore.Uint8Type:
		return true
	}
	return false
}

func keys(fs []zapcore.Field) string {
	var ks []string
	for _, f := range fs {
		ks = append(ks, f.Key)
	}
	return strings.Join(ks, ",")
}
