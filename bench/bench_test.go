package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestMain lets the test binary serve as the child process, as the bench
// binary does: the orchestrator re-executes os.Executable().
func TestMain(m *testing.M) {
	if spec := os.Getenv(envChild); spec != "" {
		if err := runChild(spec, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSmoke runs the whole pipeline small, on kfake: preload, every
// consumer with both handlers, latency runs, the startup phase, the report
// and the markdown update, so the program cannot rot unnoticed.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every consumer in a child process: about a minute")
	}
	dir := t.TempDir()
	out := filepath.Join(dir, "BENCHMARKS.md")
	other := "<!-- bench:kafka:begin -->\nkept\n<!-- bench:kafka:end -->\n"
	notes := "\n## Notes\n\nhand-written, kept\n"
	if err := os.WriteFile(out, []byte("# Benchmarks\n\nintro replaced\n\n"+other+notes), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{
		"-brokers=", "-messages", "2000", "-sizes", "100", "-rounds", "1", "-max-window", "1s", "-sleep-window", "1s",
		"-latency-duration", "300ms", "-startup-partitions", "20", "-startup-messages", "10", "-startup-idle-window", "500ms", "-out", out,
	}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	md := stdout.String()
	for _, want := range []string{
		"## In-process broker: kfake",
		"### 100 B values, no-op handler",
		"### 100 B values, 1 ms sleep handler",
		"| tidemark |", "| tidemark-nosync |", "| kafka-go-1s |", "| kafka-go-sync |", "| sarama |", "| franz-go |",
		"### Targets (ratios from this run)",
		"tidemark msgs/s >= 0.8x franz-go", "tidemark CPU per message <= 2.0x franz-go", "tidemark msgs/s >= 1.0x sarama",
		"tidemark's CPU at that rate <= 2x franz-go's", "open fds <= 50", "peak RSS <= 256 MiB", "<= 10 fetch requests/s per broker",
		"bounded by `MaxBufferedBytes`",
		"### Startup with 20 partitions",
		"| restart again, `MaxBufferedBytes` 8 MiB |", "idle: fetch requests/s per broker",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "NaN") {
		t.Errorf("report holds NaN:\n%s", md)
	}
	file, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(file)
	if !strings.HasPrefix(doc, mdHeader) || strings.Contains(doc, "intro replaced") || !strings.HasSuffix(doc, notes) || !strings.Contains(doc, other) || !strings.Contains(doc, md) {
		t.Errorf("%s should start with the method, keep the kafka section and hold the new kfake section before it:\n%s", out, doc)
	}
	if strings.Index(doc, "bench:kfake:begin") > strings.Index(doc, "bench:kafka:begin") {
		t.Errorf("the kfake section should come before the kafka one:\n%s", doc)
	}
}

func TestUpdateMarkdownReplacesItsSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "B.md")
	sec := func(body string) string {
		return "<!-- bench:kfake:begin (x) -->\n" + body + "\n<!-- bench:kfake:end -->\n"
	}
	for _, body := range []string{"BODY-ONE", "BODY-TWO"} {
		if err := updateMarkdown(path, "kfake", sec(body)); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	if !strings.HasPrefix(doc, "# Benchmarks") || strings.Contains(doc, "BODY-ONE") || strings.Count(doc, "bench:kfake:begin") != 1 || !strings.Contains(doc, "BODY-TWO") {
		t.Errorf("got:\n%s", doc)
	}
}

func TestParseConsumerPerf(t *testing.T) {
	out := "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec\n" +
		"2026-01-01 10:00:00:000, 2026-01-01 10:00:03:000, 95.3674, 31.7891, 1000000, 333333.3333, 500, 2500, 38.1470, 400000.0000\n"
	r, err := parseConsumerPerf(out)
	if err != nil {
		t.Fatal(err)
	}
	if r.Messages != 1_000_000 || r.Window != 2500*time.Millisecond || rate(r) != 400000 {
		t.Errorf("got %+v (rate %v)", r, rate(r))
	}
	if _, err := parseConsumerPerf("nothing\n"); err == nil {
		t.Error("no error for output without a result line")
	}
}

func TestFigures(t *testing.T) {
	rs := []childResult{{Messages: 100, Window: time.Second}, {Messages: 300, Window: time.Second}, {Messages: 200, Window: time.Second}}
	if m := median(rs, rate); m != 200 {
		t.Errorf("median = %v, want 200", m)
	}
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.4: "1,234,567", -4321: "-4,321"} {
		if got := thousands(v); got != want {
			t.Errorf("thousands(%v) = %q, want %q", v, got, want)
		}
	}
	for n, want := range map[int]string{8 << 20: "8 MiB", 16 << 10: "16 KiB", 1000: "1000 B", 3<<20 + 1: "3145729 B"} {
		if got := bytesText(n); got != want {
			t.Errorf("bytesText(%d) = %q, want %q", n, got, want)
		}
	}
	if got := rotate([]string{"a", "b", "c"}, 1); strings.Join(got, "") != "bca" {
		t.Errorf("rotate = %v", got)
	}
}
