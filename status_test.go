package tidemark_test

// What operators see of a consumer: the status page rendered in a real
// browser, and the fields of every log line about a partition.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zapcore"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/kafkaproxy"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// The status page in a real browser: a consumer (kfake, or KAFKA_BROKERS)
// serving Config.StatusAddr, with a backlog it handles at about 100
// messages a second, one partition stopped by the Stop policy, and every
// commit failing (COORDINATOR_NOT_AVAILABLE from the fault proxy).
// Headless Chromium renders /status; the DOM it dumps lists every
// partition with its state, the stopped one first, and the commit error;
// the trend section has the lag and handled-rate sparklines and "caught up
// in ~N s", each partition its own sparklines and estimate (the stopped one
// not catching up). A screenshot is kept in the test's artifact directory
// (go test -artifacts keeps it; docs/status.png is one).
func TestStatusPageInBrowser(t *testing.T) {
	bin := chromium(t)
	// 1,500 messages a partition at 100 a second in all: the backlog
	// lasts about 45 s, the estimate needs 3 samples, 5 s apart, of the
	// assignment.
	const parts, perPart, poison = 4, 1500, 57
	// Readable names on the in-process broker (this test's own); unique
	// ones on a real broker.
	cl := testsupport.Start(t)
	topic, group := cl.FixedName(t, "orders"), cl.FixedName(t, "billing")
	cl.CreateTopic(t, topic, parts)
	cl.Produce(t, topic, parts, 0, perPart)
	fail, err := cl.Proxy.Fail(kmsg.OffsetCommit, 15)
	if err != nil {
		t.Fatal(err)
	}
	defer fail.Remove()
	rec := &testsupport.Recorder{}
	var slow sync.Mutex
	rec.Before = func(_ context.Context, m kafka.Message) error {
		if m.Partition == 0 && m.Offset == poison {
			return errors.New("poison message: the downstream refuses it")
		}
		slow.Lock() // 100 messages a second in all
		time.Sleep(10 * time.Millisecond)
		slow.Unlock()
		return nil
	}
	log, logs := testsupport.ObservedLogger(t, zapcore.InfoLevel)
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "offsets.db"), rec)
	cfg.Logger = log
	cfg.Failure = framework.FailurePolicy{Action: framework.Stop, MaxAttempts: 2}
	cfg.StatusAddr = "127.0.0.1:0"
	r := frameworktest.Start(t, cfg)
	base := testsupport.StatusURL(t, logs)
	testsupport.WaitFor(t, time.Minute, "partition 0 stopped, the others handling their backlog, every commit failing, the estimate catching up", func() bool {
		st := r.C.Stats()
		if len(st.Partitions) != parts {
			return false
		}
		for _, p := range st.Partitions {
			if p.CommitError == "" {
				return false
			}
			if p.Partition == 0 && p.State != framework.StateStopped {
				return false
			}
			if p.Partition != 0 && (p.Processed == 0 || p.Lag == 0) {
				return false
			}
		}
		return trendState(t, base) == "catching-up"
	})

	dom := browse(t, bin, base+"/status", "--dump-dom")
	rows := rowRE.FindAllStringSubmatch(dom, -1)
	if len(rows) != parts {
		t.Fatalf("%d partition rows in the rendered page, want %d:\n%s", len(rows), parts, dom)
	}
	first := rows[0]
	if first[1] != topic || first[2] != "0" || first[3] != "stopped" || first[4] != "stopped" {
		t.Errorf("first row: topic %q partition %s state %q trouble %q, want the stopped partition 0 first", first[1], first[2], first[3], first[4])
	}
	seen := map[string]bool{}
	for _, row := range rows[1:] {
		seen[row[2]] = true
		if row[1] != topic || row[3] != "running" || row[4] != "commit-error" {
			t.Errorf("row of partition %s: topic %q state %q trouble %q, want running with a commit error", row[2], row[1], row[3], row[4])
		}
	}
	if len(seen) != parts-1 || seen["0"] {
		t.Errorf("partitions listed after the stopped one: %v, want the %d others once each", seen, parts-1)
	}
	for _, want := range []string{"Coordinator Not Available", `data-commit-error="true"`, "poison message: the downstream refuses it",
		`id="commit-trouble"`, `id="ready" class="ok"`, `id="health" class="ok"`} {
		if !strings.Contains(dom, want) {
			t.Errorf("the rendered page lacks %q", want)
		}
	}
	if m := regexp.MustCompile(`id="commits" data-ok="(\d+)" data-fenced="\d+" data-error="(\d+)"`).FindStringSubmatch(dom); m == nil {
		t.Error("no commit counts in the page")
	} else if n, _ := strconv.Atoi(m[2]); n == 0 {
		t.Errorf("commit counts: error %s, want some", m[2])
	}
	// The trends: two sparklines overall, two in each row, each a line.
	if n := len(sparkRE.FindAllString(dom, -1)); n != 2+2*parts {
		t.Errorf("%d sparklines in the rendered page, want %d", n, 2+2*parts)
	}
	if n := strings.Count(dom, "<polyline "); n != 2+2*parts {
		t.Errorf("%d sparkline lines, want %d", n, 2+2*parts)
	}
	if m := etaRE.FindStringSubmatch(dom); m == nil {
		t.Error("no estimate in the rendered page")
	} else if secs, _ := strconv.Atoi(m[1]); m[2] != "caught up in ~" || secs <= 0 {
		t.Errorf("estimate: %q, %s s; want \"caught up in ~N s\" for the backlog", m[2], m[1])
	}
	if !strings.Contains(dom, `id="eta-behind" data-behind="1"`) {
		t.Error("the page does not say that one partition is not catching up")
	}
	for i, row := range strings.Split(dom, `<tr class="partition`)[1:] {
		m := rowETARE.FindStringSubmatch(row)
		switch {
		case m == nil:
			t.Errorf("row %d has no estimate", i)
		case i == 0 && m[1] != "steady":
			t.Errorf("the stopped partition's estimate: %s, want steady (not catching up)", m[1])
		case i > 0 && m[1] != "catching-up" && m[1] != "keeping-up":
			t.Errorf("row %d's estimate: %s, want catching up", i, m[1])
		}
	}

	shot := filepath.Join(t.ArtifactDir(), "status.png")
	browse(t, bin, base+"/status", "--screenshot="+shot, "--window-size=1400,900")
	b, err := os.ReadFile(shot)
	if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) {
		t.Fatalf("screenshot %s: %v (%d bytes, not a PNG)", shot, err, len(b))
	}
	t.Logf("screenshot of the status page: %s (%d bytes)", shot, len(b))

	// The probes as Kubernetes sees them, during the outage.
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %d during a commit outage, want 200", path, resp.StatusCode)
		}
	}
}

// Every log line about a partition carries topic and partition, and its
// offset where there is one, under the same names and types everywhere
// (issue 12): a consumer goes through a retried message, a message stopped
// by the Stop policy and resumed, a pause and resume, a failed commit and a
// graceful stop, logging at debug level into an observer; every entry that
// has "partition" or "offset" has "topic" (a string) and "partition" (an
// integer), "offset" is an integer, and no entry uses another key for them.
func TestLogFields(t *testing.T) {
	const parts, perPart = 2, 30
	cl, topic := testsupport.NewTopic(t, parts, perPart)
	group := testsupport.Name(t, "g")
	log, logs := testsupport.ObservedLogger(t, zapcore.DebugLevel)
	var retried, stopping atomic.Bool
	stopping.Store(true)
	rec := &testsupport.Recorder{}
	rec.Before = func(_ context.Context, m kafka.Message) error {
		switch {
		case m.Partition == 0 && m.Offset == 3 && !retried.Swap(true):
			return errors.New("transient")
		case m.Partition == 1 && m.Offset == 5 && stopping.Load():
			return errors.New("poison")
		}
		return nil
	}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, filepath.Join(t.TempDir(), "offsets.db"), rec)
	cfg.Logger = log
	cfg.Failure = framework.FailurePolicy{Action: framework.Stop, MaxAttempts: 2}
	fail, err := cl.Proxy.Fail(kmsg.OffsetCommit, 15, kafkaproxy.Times(2))
	if err != nil {
		t.Fatal(err)
	}
	defer fail.Remove()
	r := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, time.Minute, "partition 1 stopped", func() bool {
		for _, p := range r.C.Stats().Partitions {
			if p.Partition == 1 && p.State == framework.StateStopped {
				return true
			}
		}
		return false
	})
	stopping.Store(false)
	if err := r.C.Pause(topic, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.C.Resume(topic, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.C.Resume(topic, 1); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, time.Minute, "everything handled", func() bool { return rec.Count() == parts*perPart })
	r.Stop(t)

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

// chromium returns the headless browser to load pages with, or skips the
// test saying how to get one.
func chromium(t *testing.T) string {
	t.Helper()
	// Debian's and Fedora's name, Ubuntu's and Alpine's older one, Google's
	// builds (.ci/run looks for the same names).
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Skip("no headless browser: none of chromium, chromium-browser, google-chrome, google-chrome-stable is on PATH (on Debian: apt-get install chromium; .ci/run installs it where it can)")
	return ""
}

// browse runs chromium headless on url with args (--dump-dom,
// --screenshot=FILE, ...) and returns its standard output.
func browse(t *testing.T, bin, url string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	all := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--disable-extensions", "--disable-background-networking", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir()}, args...)
	cmd := exec.CommandContext(ctx, bin, append(all, url)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

// trendState is the overall estimate's state in /status.json.
func trendState(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var js struct {
		Trend struct {
			Overall struct {
				Estimate struct {
					State string `json:"state"`
				} `json:"estimate"`
			} `json:"overall"`
		} `json:"trend"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&js); err != nil {
		t.Fatalf("/status.json: %v", err)
	}
	return js.Trend.Overall.Estimate.State
}

var (
	sparkRE  = regexp.MustCompile(`<svg [^>]*class="spark"`)
	etaRE    = regexp.MustCompile(`<div id="eta" class="eta eta-catching-up" data-state="catching-up" data-eta-seconds="(\d+)">(caught up in ~)\d+ (s|min)</div>`)
	rowETARE = regexp.MustCompile(`data-eta-state="([^"]+)"`)
)

var rowRE = regexp.MustCompile(`<tr class="partition[^"]*" data-topic="([^"]*)" data-partition="(\d+)" data-state="([^"]*)" data-trouble="([^"]*)"`)

// Keys a line about a partition must not use instead of "topic",
// "partition" and "offset".
var altKeys = []string{"tp", "t", "p", "o", "part", "off", "offs", "topic_partition", "topicPartition", "topic_name",
	"partition_id", "partitionId", "partitionID", "kafka_topic", "kafka_partition", "kafka_offset", "msg_offset",
	"message_offset", "watermark"}

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
