package framework_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/zap/zapcore"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/kafkaproxy"
	"github.com/tidemark/tidemark/internal/testfs"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// statusConfig is a Config for the status tests: frameworktest.Config with
// a handler that does nothing, the status server on a free loopback port,
// no inspect socket.
func statusConfig(t *testing.T, cl *testsupport.Cluster, topic, group, file string) framework.Config {
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, file,
		handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }))
	cfg.InspectSocket = framework.InspectDisabled
	cfg.StatusAddr = "127.0.0.1:0"
	return cfg
}

// statusRun is a consumer running with Config.StatusAddr, and the base URL
// of its status server, read from its log.
type statusRun struct {
	*frameworktest.Running
	base string
}

func runWithStatus(t *testing.T, cfg framework.Config) *statusRun {
	t.Helper()
	log, logs := testsupport.ObservedLogger(t, zapcore.InfoLevel)
	cfg.Logger = log
	r := frameworktest.Start(t, cfg)
	return &statusRun{Running: r, base: testsupport.StatusURL(t, logs)}
}

// fetch sends one request and returns the status, body and header.
// snapshot is the snapshot a consumer serves, as the command reads it.
type snapshot = inspect.Snapshot[framework.Stats]

// statusPage is the page `tidemark serve` serves over src: framework's,
// registered in internal/inspect.
func statusPage(t *testing.T, src inspect.Source[framework.Stats]) http.Handler {
	t.Helper()
	h, err := inspect.StatusPage(src)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func fetch(t *testing.T, method, url string) (int, string, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := &http.Client{Timeout: 10 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	cl.CloseIdleConnections()
	return resp.StatusCode, string(b), resp.Header
}

// probe returns a probe's status and body, logged.
func probe(t *testing.T, base, path string) (int, string) {
	t.Helper()
	code, body, _ := fetch(t, http.MethodGet, base+path)
	return code, strings.TrimSpace(body)
}

func TestStatusAddrConfig(t *testing.T) {
	base := framework.Config{Brokers: []string{"127.0.0.1:9092"}, GroupID: "g", Topics: []string{"t"},
		Handler: handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil })}
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"", true}, {":9464", true}, {"127.0.0.1:0", true}, {"0.0.0.0:9464", true}, {"[::1]:9464", true}, {"localhost:8080", true},
		{"9464", false}, {"host:port", false}, {":http", false}, {":70000", false}, {":-1", false}, {"127.0.0.1:", false},
	} {
		cfg := base
		cfg.OffsetFile = filepath.Join(t.TempDir(), "offsets.db")
		cfg.StatusAddr = tc.addr
		c, err := framework.New(cfg)
		if err == nil {
			_ = c.Close()
		}
		var ce *framework.ConfigError
		switch {
		case tc.ok && err != nil:
			t.Errorf("StatusAddr %q: %v", tc.addr, err)
		case !tc.ok && (!errors.As(err, &ce) || ce.Field != "StatusAddr"):
			t.Errorf("StatusAddr %q: got %v, want a *ConfigError on StatusAddr", tc.addr, err)
		}
	}
}

// Requests the handler refuses, and what it serves before Run: every path
// answers, the probes say Run has not started.
func TestStatusBadInput(t *testing.T) {
	cfg := framework.Config{Brokers: []string{"127.0.0.1:9"}, GroupID: "billing", Topics: []string{"orders"},
		OffsetFile: filepath.Join(t.TempDir(), "offsets.db"),
		Handler:    handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil })}
	c, err := framework.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv := httptest.NewServer(c.StatusHandler())
	defer srv.Close()
	long := strings.Repeat("x", 1100)
	for _, tc := range []struct {
		method, path string
		code         int
		body         string
	}{
		{"GET", "/nope", 404, "not found"},
		{"GET", "/status/", 404, "not found"},
		{"GET", "/metrics", 404, "not found"}, // no MetricsHandler
		{"GET", "/v1/snapshot", 404, "not found"},
		{"POST", "/status", 405, "read-only"},
		{"PUT", "/healthz", 405, "read-only"},
		{"DELETE", "/readyz", 405, "read-only"},
		{"POST", "/nope", 404, "not found"},
		{"GET", "/status?q=" + long, 414, "too long"},
		{"GET", "/" + long, 414, "too long"},
		{"GET", "/status?a=%zz", 400, "bad query"},
		{"GET", "/", 302, ""},
		{"GET", "/healthz", 503, "Run has not been called"},
		{"GET", "/readyz", 503, "Run has not been called"},
		{"GET", "/status", 200, "<table"},
		{"GET", "/status.json", 200, `"format":"tidemark-inspect"`},
		{"HEAD", "/status", 200, ""},
		{"HEAD", "/healthz", 503, ""},
	} {
		code, body, h := fetch(t, tc.method, srv.URL+tc.path)
		name := tc.method + " " + tc.path[:min(len(tc.path), 40)]
		if code != tc.code {
			t.Errorf("%s: status %d, want %d (%s)", name, code, tc.code, strings.TrimSpace(body))
		}
		if !strings.Contains(body, tc.body) {
			t.Errorf("%s: body %q does not contain %q", name, body[:min(len(body), 300)], tc.body)
		}
		if tc.method == "HEAD" && body != "" {
			t.Errorf("%s: a body on HEAD", name)
		}
		if code == 405 && h.Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: Allow %q, want \"GET, HEAD\"", name, h.Get("Allow"))
		}
		if code == 302 && h.Get("Location") != "status" {
			t.Errorf("%s: Location %q, want status", name, h.Get("Location"))
		}
	}
	code, body, h := fetch(t, "GET", srv.URL+"/status")
	if code != 200 || !strings.HasPrefix(h.Get("Content-Type"), "text/html") || !strings.Contains(h.Get("Content-Security-Policy"), "default-src 'none'") {
		t.Errorf("/status: %d, Content-Type %q, CSP %q", code, h.Get("Content-Type"), h.Get("Content-Security-Policy"))
	}
	for _, want := range []string{`http-equiv="refresh"`, `id="group">billing<`, "no partition assigned yet", `id="health" class="bad"`} {
		if !strings.Contains(body, want) {
			t.Errorf("/status lacks %q", want)
		}
	}
	if strings.Contains(body, "<script") || strings.Contains(body, "src=") || strings.Contains(body, "<link") {
		t.Error("/status loads a script or an external asset")
	}
	_, body, _ = fetch(t, "GET", srv.URL+"/status.json?failures=1")
	var snap snapshot
	if err := json.Unmarshal([]byte(body), &snap); err != nil {
		t.Fatalf("/status.json: %v", err)
	}
	if snap.Stats.Group != "billing" || snap.Pid != os.Getpid() || snap.Version != inspect.SnapshotVersion {
		t.Errorf("/status.json: group %q pid %d version %d", snap.Stats.Group, snap.Pid, snap.Version)
	}
}

// MetricsHandler is mounted at /metrics, made once.
func TestStatusMetricsHandler(t *testing.T) {
	calls := 0
	cfg := framework.Config{Brokers: []string{"127.0.0.1:9"}, GroupID: "billing", Topics: []string{"orders"},
		OffsetFile: filepath.Join(t.TempDir(), "offsets.db"),
		Handler:    handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }),
		MetricsHandler: func(c *framework.Consumer) http.Handler {
			calls++
			return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				fmt.Fprintf(w, "tidemark_up{group=%q} 1\n", c.Stats().Group)
			})
		}}
	c, err := framework.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv := httptest.NewServer(c.StatusHandler())
	defer srv.Close()
	_ = c.StatusHandler()
	if code, body, _ := fetch(t, "GET", srv.URL+"/metrics"); code != 200 || body != "tidemark_up{group=\"billing\"} 1\n" {
		t.Errorf("/metrics: %d %q", code, body)
	}
	if code, _, _ := fetch(t, "POST", srv.URL+"/metrics"); code != 405 {
		t.Errorf("POST /metrics: %d, want 405", code)
	}
	if calls != 1 {
		t.Errorf("MetricsHandler called %d times, want once", calls)
	}
}

// Readiness fails before the first assignment (the first JoinGroup is held
// by the fault proxy) while liveness passes, and passes once the partitions
// are reconciled; Run serves Config.StatusAddr and stops serving it when
// it returns.
func TestStatusReadiness(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 3)
	cl.Produce(t, topic, 3, 0, 20)
	hold, err := cl.Proxy.Delay(kmsg.JoinGroup, 1500*time.Millisecond, kafkaproxy.Times(1))
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Remove()
	r := runWithStatus(t, statusConfig(t, cl, topic, group, filepath.Join(t.TempDir(), "offsets.db")))
	code, body := probe(t, r.base, "/readyz")
	if code != 503 || !strings.Contains(body, "not a member") {
		t.Errorf("/readyz while joining: %d %q, want 503 not a member", code, body)
	}
	if code, body := probe(t, r.base, "/healthz"); code != 200 || body != "ok" {
		t.Errorf("/healthz while joining: %d %q, want 200 ok", code, body)
	}
	testsupport.WaitFor(t, 30*time.Second, "/readyz 200", func() bool {
		code, body = probe(t, r.base, "/readyz")
		return code == 200
	})
	if body != "ready" {
		t.Errorf("/readyz: %q, want \"ready\"", body)
	}
	st := r.C.Stats()
	if st.Generation <= 0 || len(st.Partitions) != 3 {
		t.Fatalf("ready with generation %d and %d partitions", st.Generation, len(st.Partitions))
	}
	for _, p := range st.Partitions {
		if p.State == framework.StateReconciling {
			t.Errorf("ready while %s/%d is reconciling", p.Topic, p.Partition)
		}
	}
	if r.C.Ready() != nil || r.C.Healthy() != nil {
		t.Errorf("Ready %v, Healthy %v", r.C.Ready(), r.C.Healthy())
	}
	base := r.base
	r.Stop(t)
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Error("the status server still answers after Run returned")
	}
	if err := r.C.Healthy(); err == nil || !strings.Contains(err.Error(), "Run returned") {
		t.Errorf("Healthy after Run: %v", err)
	}
	if err := r.C.Ready(); err == nil {
		t.Error("Ready after Run returned nil")
	}
}

// A commit outage: commits fail with COORDINATOR_NOT_AVAILABLE. Readiness
// and liveness stay 200, /readyz says commits fail; once commits succeed
// again it no longer does.
func TestStatusCommitOutage(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 2)
	cl.Produce(t, topic, 2, 0, 50)
	r := runWithStatus(t, statusConfig(t, cl, topic, group, filepath.Join(t.TempDir(), "offsets.db")))
	testsupport.WaitFor(t, 30*time.Second, "ready", func() bool { code, _ := probe(t, r.base, "/readyz"); return code == 200 })
	fail, err := cl.Proxy.Fail(kmsg.OffsetCommit, 15)
	if err != nil {
		t.Fatal(err)
	}
	cl.Produce(t, topic, 2, 50, 50)
	var body string
	testsupport.WaitFor(t, 30*time.Second, "/readyz to report the failing commits", func() bool {
		var code int
		code, body = probe(t, r.base, "/readyz")
		if code != 200 {
			t.Fatalf("/readyz during a commit outage: %d %q, want 200", code, body)
		}
		return strings.Contains(body, "commits to Kafka failing for 2 partition(s)")
	})
	if !strings.HasPrefix(body, "ready\n") || !strings.Contains(body, "Coordinator Not Available") {
		t.Errorf("/readyz during the outage: %q", body)
	}
	code, hbody := probe(t, r.base, "/healthz")
	if code != 200 || !strings.HasPrefix(hbody, "ok\n") {
		t.Errorf("/healthz during a commit outage: %d %q, want 200 ok", code, hbody)
	}
	_, page, _ := fetch(t, "GET", r.base+"/status")
	if !strings.Contains(page, `data-trouble="commit-error"`) || !strings.Contains(page, `id="commit-trouble"`) {
		t.Error("the status page does not show the commit outage")
	}
	fail.Remove()
	testsupport.WaitFor(t, 30*time.Second, "/readyz plain ready after the outage", func() bool {
		code, body = probe(t, r.base, "/readyz")
		return code == 200 && body == "ready"
	})
}

// The offset file stops taking writes (a full tmpfs): /healthz fails with
// the write error while /readyz stays 200; room made, /healthz recovers.
func TestStatusOffsetFileFull(t *testing.T) {
	dir := testfs.SmallFS(t, 1<<20)
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 2)
	cl.Produce(t, topic, 2, 0, 3000)
	cfg := statusConfig(t, cl, topic, group, filepath.Join(dir, "offsets.db"))
	cfg.MaxUndurable = 100
	filler := testfs.Fill(t, dir, int64(7*os.Getpagesize()))
	r := runWithStatus(t, cfg)
	var body string
	testsupport.WaitFor(t, time.Minute, "/healthz 503 with the write error", func() bool {
		var code int
		code, body = probe(t, r.base, "/healthz")
		return code == 503
	})
	if !strings.Contains(body, "offset file takes no writes") || !strings.Contains(body, "no space left on device") {
		t.Errorf("/healthz: %q", body)
	}
	// Readiness does not depend on the disk: it comes once the partitions
	// are reconciled (their flushes fail; they go on).
	testsupport.WaitFor(t, 30*time.Second, "/readyz 200 with the disk still full", func() bool {
		code, _ := probe(t, r.base, "/readyz")
		return code == 200
	})
	testsupport.WaitFor(t, time.Minute, "the status page to show the write error and the partitions waiting for the file", func() bool {
		_, page, _ := fetch(t, "GET", r.base+"/status")
		return strings.Contains(page, `id="offset-file-error"`) && strings.Count(page, `data-trouble="durable-wait"`) == 2
	})
	if code, _ := probe(t, r.base, "/healthz"); code != 503 {
		t.Errorf("/healthz %d while the partitions wait for the offset file, want 503", code)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, time.Minute, "/healthz 200 once the disk has room", func() bool {
		code, body := probe(t, r.base, "/healthz")
		return code == 200 && body == "ok"
	})
}

// The partition table labels its counts, and a last error kept after the
// partition recovered says how old it is; joins failing and a dead-letter
// topic refusing writes each get a banner.
func TestStatusPageLabelsAndAges(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	snap := &snapshot{Format: inspect.Format, Version: inspect.SnapshotVersion, Pid: 7,
		TakenAt: at, Stats: framework.Stats{Group: "g", Generation: 0,
			JoinError: "finding the coordinator of group g (brokers 127.0.0.1:1): connection refused", JoinFailingSince: at.Add(-time.Minute), JoinFailures: 9,
			DeadLetterError: `dead-letter topic "dlt": writes fail`, DeadLetterErrorSince: at.Add(-2 * time.Minute),
			Partitions: []framework.PartitionStats{{Topic: "t", Partition: 0, State: framework.StateRunning, InFlight: 14, Waiting: 1381,
				LastError: "fetch t/0 at offset 5 from broker 1: EOF", LastErrorAt: at.Add(-3 * time.Minute)},
				{Topic: "t", Partition: 1, State: framework.StateRunning, Processed: 40, HighWatermark: 90, LastStable: 40, TransactionWait: 3 * time.Second}}}}
	h := statusPage(t, func(context.Context, bool) (*snapshot, error) { return snap, nil })
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/status", nil))
	page := w.Body.String()
	for _, want := range []string{
		">in flight / waiting</th>", `<td class="n">14 / 1381</td>`,
		`<span class="mute last-error-age">3m0s ago:</span> fetch t/0 at offset 5`, "(at 2026-12-01 11:57:00Z)",
		`id="join-trouble">joining the group has failed since 2026-12-01 11:59:00Z (9 attempts): finding the coordinator of group g (brokers 127.0.0.1:1)`,
		`id="dead-letter-trouble">dead-letter topic &#34;dlt&#34;: writes fail (since 2026-12-01 11:58:00Z)`,
		`<td class="n">90<span class="flags lso"`, ">LSO 40</span>", `<span class="flags">held at 40 by an open transaction for 3s</span>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("page:\n%s", page)
	}
}

// The status page of `tidemark serve` keeps the trends from the snapshots it serves: a partition
// draining 100 messages a second and one stopped show their sparklines and
// estimates on the page and in /status.json; a snapshot of another process
// starts afresh, and the file's own snapshot shows none.
func TestStatusPageTrend(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	n, pid := 0, 7
	snap := func(context.Context, bool) (*snapshot, error) {
		i := n
		n++
		return &snapshot{Format: inspect.Format, Version: inspect.SnapshotVersion, Pid: pid,
			Started: at.Add(-time.Hour), TakenAt: at.Add(time.Duration(i) * 5 * time.Second), Stats: framework.Stats{Group: "g", Generation: 1, Rebalances: 1,
				Partitions: []framework.PartitionStats{
					{Topic: "t", Partition: 0, State: framework.StateRunning, Lag: int64(3000 - 500*i), Handled: uint64(500 * i)},
					{Topic: "t", Partition: 1, State: framework.StateStopped, Lag: 200, Handled: 57}}}}, nil
	}
	h := statusPage(t, snap)
	get := func(path string) string {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != 200 {
			t.Fatalf("%s: %d %s", path, w.Code, w.Body)
		}
		return w.Body.String()
	}
	page := get("/status")
	for _, want := range []string{`id="trend" data-samples="1"`, `data-state="measuring"`, "measuring (1 of 3 samples)"} {
		if !strings.Contains(page, want) {
			t.Errorf("first page lacks %q", want)
		}
	}
	get("/status")
	get("/status")
	page = get("/status") // 4 samples, 15 s: overall lag 3,200 to 1,700, 100 handled a second
	for _, want := range []string{
		`id="trend" data-samples="4"`, "(last 15s, a sample every 5s: 4 samples)",
		`<div id="eta" class="eta eta-catching-up" data-state="catching-up" data-eta-seconds="17">caught up in ~17 s</div>`,
		"over the last minute: handled 100/s, produced 0/s", "a trend per partition for 2 of 2 owned",
		`id="eta-behind" data-behind="1">1 partition(s) not catching up`,
		`<span class="flags eta eta-catching-up" data-eta-state="catching-up">caught up in ~15 s</span>`,
		`<span class="flags eta eta-steady" data-eta-state="steady">not catching up (nothing handled)</span>`,
		`aria-label="lag, last 15s: 3,200 to 1,700, at most 3,200"`, `aria-label="t/1 lag: 200 to 200, at most 200"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if got := strings.Count(page, `<svg xmlns="http://www.w3.org/2000/svg" class="spark"`); got != 6 {
		t.Errorf("%d sparklines, want 6 (lag and rate, overall and for each partition)", got)
	}
	if strings.Contains(page, "<script") || strings.Contains(page, "src=") || strings.Contains(page, "href=\"http") {
		t.Error("the page loads a script or an external asset")
	}

	var js struct {
		Stats struct{ Group string }
		Trend struct {
			IntervalNs int64       `json:"interval_ns"`
			SampledAt  []time.Time `json:"sampled_at"`
			Overall    struct {
				Lag              []int64   `json:"lag"`
				HandledPerSecond []float64 `json:"handled_per_second"`
				Estimate         struct {
					State      string  `json:"state"`
					Text       string  `json:"text"`
					ETASeconds float64 `json:"eta_seconds"`
				} `json:"estimate"`
			} `json:"overall"`
			Partitions []struct {
				Topic     string  `json:"topic"`
				Partition int     `json:"partition"`
				Lag       []int64 `json:"lag"`
				Estimate  struct {
					State string `json:"state"`
				} `json:"estimate"`
			} `json:"partitions"`
		} `json:"trend"`
	}
	body := get("/status.json") // the 5th sample: lag 1,200 at 100/s
	if err := json.Unmarshal([]byte(body), &js); err != nil {
		t.Fatalf("/status.json: %v\n%s", err, body)
	}
	var back snapshot
	if err := json.Unmarshal([]byte(body), &back); err != nil || back.Stats.Group != "g" || len(back.Stats.Partitions) != 2 {
		t.Errorf("/status.json no longer decodes as the snapshot: %v, %+v", err, back.Stats)
	}
	tr, o := js.Trend, js.Trend.Overall
	if tr.IntervalNs != int64(5*time.Second) || len(tr.SampledAt) != 5 || !tr.SampledAt[4].Equal(at.Add(20*time.Second)) {
		t.Errorf("trend: interval %d, sampled at %v", tr.IntervalNs, tr.SampledAt)
	}
	if fmt.Sprint(o.Lag) != "[3200 2700 2200 1700 1200]" || fmt.Sprint(o.HandledPerSecond) != "[100 100 100 100]" {
		t.Errorf("overall: lag %v, handled %v/s", o.Lag, o.HandledPerSecond)
	}
	if o.Estimate.State != "catching-up" || o.Estimate.ETASeconds != 12 || o.Estimate.Text != "caught up in ~12 s" {
		t.Errorf("overall estimate: %+v", o.Estimate)
	}
	if len(tr.Partitions) != 2 || tr.Partitions[0].Partition != 0 || tr.Partitions[1].Estimate.State != "steady" || len(tr.Partitions[1].Lag) != 5 {
		t.Errorf("partitions: %+v", tr.Partitions)
	}

	pid = 8 // the consumer restarted
	if page := get("/status"); !strings.Contains(page, `id="trend" data-samples="1"`) {
		t.Error("the trend of the process before was kept")
	}
	pid = 0 // the file alone
	if page := get("/status"); strings.Contains(page, `id="trend"`) || strings.Contains(page, "<svg") {
		t.Error("the file's page shows a trend")
	}
	if body := get("/status.json"); strings.Contains(body, `"trend"`) {
		t.Error("the file's snapshot has a trend")
	}
}

// A running consumer samples its Stats for the page every 5 s once its
// StatusHandler exists: with a backlog handled at 100 messages a second,
// /status.json shows the partitions' series and a handled rate, and the
// page their sparklines.
func TestStatusTrendSampled(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 2)
	cl.Produce(t, topic, 2, 0, 1500)
	cfg := statusConfig(t, cl, topic, group, filepath.Join(t.TempDir(), "offsets.db"))
	cfg.StatusAddr = ""
	var mu sync.Mutex
	cfg.Handler = handler.HandlerFunc(func(context.Context, kafka.Message) error {
		mu.Lock() // 100 messages a second in all
		defer mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		return nil
	})
	c, err := framework.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.StatusHandler())
	defer srv.Close()
	frameworktest.Run(t, c)
	var js struct {
		Trend struct {
			SampledAt []time.Time `json:"sampled_at"`
			Overall   struct {
				HandledPerSecond []float64 `json:"handled_per_second"`
			} `json:"overall"`
			Partitions []struct {
				Lag []int64 `json:"lag"`
			} `json:"partitions"`
		} `json:"trend"`
	}
	testsupport.WaitFor(t, 30*time.Second, "two samples of both partitions in /status.json", func() bool {
		_, body, _ := fetch(t, "GET", srv.URL+"/status.json")
		if err := json.Unmarshal([]byte(body), &js); err != nil {
			t.Fatalf("/status.json: %v", err)
		}
		tr := js.Trend
		return len(tr.Partitions) == 2 && len(tr.Partitions[0].Lag) >= 2 && len(tr.Partitions[1].Lag) >= 2
	})
	tr := js.Trend
	if gap := tr.SampledAt[len(tr.SampledAt)-1].Sub(tr.SampledAt[len(tr.SampledAt)-2]); gap < 4*time.Second || gap > 15*time.Second {
		t.Errorf("samples %s apart, want 5 s (at least 4 s, a late tick at most 15 s)", gap)
	}
	if r := tr.Overall.HandledPerSecond; r[len(r)-1] <= 0 || r[len(r)-1] > 150 {
		t.Errorf("handled rates %v/s, want the last one above 0 and at most about 100", r)
	}
	if lag := tr.Partitions[0].Lag; lag[len(lag)-1] <= 0 {
		t.Errorf("partition 0's lag %v: the backlog of 1,500 is gone already", lag)
	}
	_, page, _ := fetch(t, "GET", srv.URL+"/status")
	if got := strings.Count(page, `<svg xmlns="http://www.w3.org/2000/svg" class="spark"`); got != 6 {
		t.Errorf("%d sparklines on the page, want 6", got)
	}
}
