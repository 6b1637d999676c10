//go:build unix

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// syncBuffer is a bytes.Buffer safe for the command's goroutine and the
// test's.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var serveURLRE = regexp.MustCompile(`at (http://[0-9.:]+)/status`)

// serving is `tidemark serve` running in-process.
type serving struct {
	base   string
	stdout *syncBuffer
	done   chan error
}

// startServe runs `tidemark serve FILE --addr 127.0.0.1:0` and waits for
// the address it prints.
func startServe(t *testing.T, file string) *serving {
	t.Helper()
	s := &serving{stdout: &syncBuffer{}, done: make(chan error, 1)}
	var stderr syncBuffer
	go func() { s.done <- run([]string{"serve", file, "--addr", "127.0.0.1:0"}, s.stdout, &stderr) }()
	testsupport.WaitForNoError(t, 10*time.Second, "serve to print its address", func() error {
		if m := serveURLRE.FindStringSubmatch(s.stdout.String()); m != nil {
			s.base = m[1]
			return nil
		}
		select {
		case err := <-s.done:
			t.Fatalf("serve returned %v before serving\nstdout: %s\nstderr: %s", err, s.stdout, stderr.String())
		default:
		}
		return fmt.Errorf("no address printed\nstdout: %s\nstderr: %s", s.stdout, stderr.String())
	})
	t.Logf("serve: %s", strings.TrimSpace(s.stdout.String()))
	return s
}

// stop sends the process SIGTERM, which serve (and only serve) is
// listening for, and waits for serve to return.
func (s *serving) stop(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-s.done:
		if err != nil {
			t.Fatalf("serve returned %v after SIGTERM", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop within 10s of SIGTERM")
	}
	if !strings.HasSuffix(s.stdout.String(), "stopped\n") {
		t.Errorf("serve's output does not end with \"stopped\": %q", s.stdout.String())
	}
	if _, err := http.Get(s.base + "/status"); err == nil {
		t.Error("serve still answers after it stopped")
	}
}

func get(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

var recordRowRE = regexp.MustCompile(`<tr class="record[^"]*" data-group="([^"]*)" data-topic="([^"]*)" data-partition="(\d+)" data-state="([^"]*)"`)

// serve on a stopped consumer's file: the page shows the file's records,
// troubles first, says no consumer runs, and shows a change made to the
// file after serve started; it refuses writes and unknown paths, and stops
// on SIGTERM.
func TestServeOffline(t *testing.T) {
	path := fixture(t)
	before := hashFile(t, path)
	s := startServe(t, path)
	code, page := get(t, "GET", s.base+"/status")
	if code != 200 || !strings.Contains(page, "offset file only: the consumer is not running") {
		t.Fatalf("/status: %d\n%s", code, page)
	}
	rows := recordRowRE.FindAllStringSubmatch(page, -1)
	var got []string
	for _, r := range rows {
		got = append(got, r[1]+"/"+r[2]+"/"+r[3]+" "+r[4])
	}
	want := []string{
		"billing/orders/2 crash-loop",
		"billing/orders/1 commit-fenced",
		"billing/orders/3 pending-commit",
		"billing/payments/0 pending-commit",
		"audit/orders/0 clean",
		"billing/orders/0 clean",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("record rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, w := range []string{"[22] Illegal Generation", "2 unclean ends in a row at offset 300", "offset 120 beyond log end 0", "1 / 1"} {
		if !strings.Contains(page, w) {
			t.Errorf("/status lacks %q", w)
		}
	}
	code, body := get(t, "GET", s.base+"/status.json?failures=1")
	var snap snapshot
	if err := json.Unmarshal([]byte(body), &snap); code != 200 || err != nil {
		t.Fatalf("/status.json: %d %v", code, err)
	}
	if snap.Pid != 0 || len(snap.Records) != 6 || len(snap.Failures) != 1 || len(snap.Failures[0].Failures) != 2 {
		t.Errorf("/status.json: pid %d, %d records, failures %+v", snap.Pid, len(snap.Records), snap.Failures)
	}
	for _, tc := range []struct {
		method, path string
		code         int
	}{{"POST", "/status", 405}, {"GET", "/healthz", 404}, {"GET", "/readyz", 404}, {"GET", "/metrics", 404},
		{"GET", "/status?" + strings.Repeat("a", 2000), 414}, {"HEAD", "/status", 200}} {
		if code, _ := get(t, tc.method, s.base+tc.path); code != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path[:min(len(tc.path), 30)], code, tc.code)
		}
	}
	if hashFile(t, path) != before {
		t.Fatal("serve changed the file")
	}
	// Re-read at every request: a repair shows at once.
	tidemark(t, "set", path, "--group", "billing", "--topic", "orders", "--partition", "2", "--offset", "310").want(t, 0)
	_, page = get(t, "GET", s.base+"/status")
	if !strings.Contains(page, `data-group="billing" data-topic="orders" data-partition="2"`) || !regexp.MustCompile(`(?s)data-partition="2" data-state="[a-z-]+">.*?<td class="n">310</td>`).MatchString(page) {
		t.Error("the page does not show the watermark set after serve started")
	}
	s.stop(t)
}

// serve on a running consumer: the page comes from its inspect socket,
// with its live partitions.
func TestServeLive(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := cl.FixedName(t, "orders"), cl.FixedName(t, "billing")
	cl.CreateTopic(t, topic, 2)
	cl.Produce(t, topic, 2, 0, 30)
	file := filepath.Join(t.TempDir(), "offsets.db")
	c := frameworktest.Start(t, frameworktest.Config(t, cl.Brokers, group, topic, file, handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil })))
	testsupport.WaitFor(t, 30*time.Second, "30 messages per partition handled", func() bool {
		st := c.C.Stats()
		return len(st.Partitions) == 2 && st.Partitions[0].Processed == 30 && st.Partitions[1].Processed == 30
	})
	s := startServe(t, file)
	code, page := get(t, "GET", s.base+"/status")
	if code != 200 || strings.Contains(page, "offset file only") {
		t.Fatalf("/status: %d\n%s", code, page)
	}
	rows := regexp.MustCompile(`<tr class="partition[^"]*" data-topic="([^"]*)" data-partition="(\d+)" data-state="([^"]*)"`).FindAllStringSubmatch(page, -1)
	if len(rows) != 2 || rows[0][1] != topic || rows[0][3] != "running" || rows[1][3] != "running" {
		t.Errorf("partition rows %q, want 2 running", rows)
	}
	if !strings.Contains(page, `id="group">`+group+`<`) || !strings.Contains(page, "<dd>"+strconv.Itoa(os.Getpid())+", since") {
		t.Error("the page does not show the live consumer's group and pid")
	}
	_, body := get(t, "GET", s.base+"/status.json")
	var snap snapshot
	if err := json.Unmarshal([]byte(body), &snap); err != nil || snap.Pid != os.Getpid() || len(snap.Stats.Partitions) != 2 {
		t.Errorf("/status.json: %v, pid %d, %d partitions", err, snap.Pid, len(snap.Stats.Partitions))
	}
	s.stop(t)
	c.Stop(t)
	// The consumer stopped: the same file, read directly.
	s = startServe(t, file)
	if _, page := get(t, "GET", s.base+"/status"); !strings.Contains(page, "offset file only") || strings.Count(page, `data-state="clean"`) != 2 {
		t.Error("after the consumer stopped, the page does not show the file's 2 clean records")
	}
	s.stop(t)
}

// Bad invocations of serve: exit 2, a message, no server.
func TestServeBadInput(t *testing.T) {
	path := fixture(t)
	tidemark(t, "serve").want(t, 2, "missing FILE")
	tidemark(t, "serve", filepath.Join(t.TempDir(), "missing.db")).want(t, 2, "no such file")
	tidemark(t, "serve", path, "--addr", "nonsense").want(t, 2, "not a host:port address")
	tidemark(t, "serve", path, "--addr", ":http").want(t, 2, "must be a number")
	junk := filepath.Join(t.TempDir(), "junk.db")
	must(t, os.WriteFile(junk, bytes.Repeat([]byte("x"), 8192), 0o600))
	tidemark(t, "serve", junk, "--addr", "127.0.0.1:0").want(t, 2, junk)
	s := startServe(t, path)
	busy := strings.TrimPrefix(s.base, "http://")
	tidemark(t, "serve", path, "--addr", busy).want(t, 2, "address already in use")
	s.stop(t)
}
