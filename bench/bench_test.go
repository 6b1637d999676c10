package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
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
// consumer with both handlers, latency runs, the startup phase, the
// concurrency section, the bounded replay section, the report and the
// markdown update, so the program cannot rot unnoticed.
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
		"-latency-duration", "300ms", "-startup-partitions", "20", "-startup-messages", "10", "-startup-idle-window", "500ms",
		"-concurrency-rounds", "1", "-concurrency-messages", "4000", "-concurrency-stuck-ahead", "300",
		"-concurrency-windows", "noop=300ms,sleep1ms=200ms,sleep20ms=200ms,sleep100ms=200ms",
		"-replay-rounds", "1", "-replay-window", "300ms", "-replay-max-undurable", "1,10,0",
		"-metrics-partitions", "20", "-metrics-partition-messages", "5", "-metrics-scrapes", "5", "-metrics-idle-window", "300ms", "-metrics-rounds", "1",
		"-txn-messages", "4000", "-txn-size", "100", "-txn-rounds", "1",
		"-leadermoves-rounds", "1", "-leadermoves-moves", "3",
		"-wide-partitions", "20,50", "-wide-messages", "1000", "-wide-idle-window", "300ms", "-wide-rounds", "1",
		"-rebalance-members", "2", "-rebalance-rounds", "1", "-rebalance-settle", "300ms",
		"-out", out,
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
		"### Concurrency inside a partition (tidemark)",
		"| no-op | `OrderPartition` (the default; `MaxInFlight` 1) |", "| no-op | `OrderKey`, `MaxInFlight` 256 |", "| no-op | `OrderNone`, `MaxInFlight` 256 |",
		"| 1 ms sleep | `OrderKey`, `MaxInFlight` 256 |", "| 20 ms sleep | `OrderKey`, `MaxInFlight` 256 |",
		"| 100 ms sleep | `OrderKey`, `MaxInFlight` 256 |", "| 100 ms sleep | `OrderKey`, `MaxInFlight` 100 (its default) |",
		"| first message of each partition stuck |", "| no stuck message |",
		"### Targets: concurrency inside a partition (ratios from this run)",
		"1 ms handler: `OrderKey`, `MaxInFlight` 256 >= 100,000 msgs/s", "1 ms handler: `OrderKey`, `MaxInFlight` 256 msgs/s >= 15x",
		"20 ms handler: `OrderKey`, `MaxInFlight` 256 msgs/s >= 50x", "90% of the 1,000-key bound",
		"`OrderPartition` on this topic loses nothing against the main table's tidemark", "CPU per message <= 2x `OrderPartition`'s",
		"8 x 300 messages completed above a stuck offset",
		"<!-- bench:kfake:replay:begin", "### Bounded replay (tidemark)", "about one write (and the `FlushInterval` between two writes) per message per partition",
		"| no-op | 1 | 8 |", "| no-op | 10 | 80 |", "| no-op | 100,000 (the default) | 800,000 | ",
		"| 1 ms sleep | 1 | 8 |", "| 1 ms sleep | 100,000 (the default) | 800,000 | ",
		"### Metrics (tidemark)", "the main tables' 100 B topic", "| with metrics, scraped every second |",
		"### Targets: metrics (from this run)", "scraping `/metrics` every second with 20 partitions costs < 1% of a CPU",
		"<!-- bench:kfake:transactions:begin", "### Transactions: read_committed (tidemark)",
		"6 transactions, 1 of them aborted, so each partition also holds 100 records of aborted transactions", "its log ends at 606 ",
		"| tidemark, `IsolationLevel: kafka.ReadCommitted`, transactional topic |", "| tidemark, `ReadUncommitted` (the default), plain topic |",
		"| franz-go, `kgo.FetchIsolationLevel(kgo.ReadCommitted())`, transactional topic |", "| franz-go, read_uncommitted (its default), plain topic |", "kfake's CPU s per 1M msgs",
		"### Targets: transactions (ratios from this run)", ">= 0.9x tidemark `ReadUncommitted` on the plain topic", ">= 1.0x franz-go's read_committed",
		"<!-- bench:kfake:transactions:end -->",
		"<!-- bench:kfake:leadermoves:begin", "### Leader moves: resume after a partition's leader moved", "| tidemark | 3 |", "| franz-go | 3 |",
		"tidemark / franz-go, resume time per move: median", "<!-- bench:kfake:leadermoves:end -->",
		"<!-- bench:kfake:wide:begin", "### Wide topics: 20 and 50 partitions", "| 50 | tidemark |", "| 50 | franz-go |",
		"**Idle, 50 partitions.**", "### Targets: wide topics (ratios from this run)",
		"50 partitions, Config defaults: tidemark's peak RSS <= 256 MiB", "50 partitions: tidemark's peak RSS <= 0.5x franz-go's",
		"<!-- bench:kfake:wide:end -->",
		"<!-- bench:kfake:rebalance:begin", "### Rebalances: a member joins, a member leaves",
		"| 2 | join | classic | 15 |", "| 2 | join | consumer | 15 |", "| 2 | leave | classic | 15 |", "| 2 | leave | consumer | 15 |",
		"- 2 members, join: move time **", "<!-- bench:kfake:rebalance:end -->",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "not measured") {
		t.Errorf("the concurrency targets should compare with the main table of the same run:\n%s", md)
	}
	for _, line := range strings.Split(md, "\n") {
		// MaxUndurable 1 writes the offset file many times in any window:
		// its rows count them.
		if (strings.HasPrefix(line, "| no-op | 1 |") || strings.HasPrefix(line, "| 1 ms sleep | 1 |")) && strings.Contains(line, "—") {
			t.Errorf("a MaxUndurable 1 row lacks a figure: %s", line)
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

// TestSmokeMetrics runs the metrics section alone, small, on kfake: it
// preloads its own topic, scrapes metrics.Handler in a child with many
// partitions, and runs the no-op throughput with and without metrics.
func TestSmokeMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("runs consumers in child processes: about 10 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, []string{
		"-brokers=", "-sections", "metrics", "-metrics-partitions", "50", "-metrics-partition-messages", "2", "-metrics-scrapes", "5",
		"-metrics-idle-window", "300ms", "-metrics-rounds", "2", "-metrics-messages", "4000", "-max-window", "1s", "-out", "",
	}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	md := stdout.String()
	for _, want := range []string{
		"### Metrics (tidemark)", "a topic of 8 partitions x 500 messages of 100 B", "| 50 |",
		"| without metrics |", "| with metrics, scraped every second |",
		"scraping `/metrics` every second with 50 partitions costs < 1% of a CPU",
		"the no-op benchmark does not move with metrics registered",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	for _, not := range []string{"NaN", "### 100 B values", "### Startup"} {
		if strings.Contains(md, not) {
			t.Errorf("report holds %q:\n%s", not, md)
		}
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

// TestConcurrencyData checks the keyed topic's layout: key k in partition
// k % partitions, every key of a partition used, and the stuck runs'
// window holding the completed messages it promises.
func TestConcurrencyData(t *testing.T) {
	for _, pick := range []string{keyPickRandom, keyPickRoundRobin} {
		o, err := parseOptions([]string{"-concurrency-key-pick", pick, "-concurrency-stuck-ahead", "1000"}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		b := &bench{o: o}
		if got := b.keysIn(0) + b.keysIn(7); got != 250 {
			t.Errorf("%s: keys in partitions 0 and 7 = %d, want 125 each", pick, got)
		}
		w := b.stuckWindow()
		for p := 0; p < o.partitions; p++ {
			used := map[int]int{}
			for i := int64(0); i < 10_000; i++ {
				k := b.keyOf(p, i)
				if k%o.partitions != p || k < 0 || k >= o.concKeys {
					t.Fatalf("%s: message %d of partition %d has key %d", pick, i, p, k)
				}
				used[k]++
			}
			if len(used) != b.keysIn(p) {
				t.Errorf("%s: partition %d uses %d keys, want %d", pick, p, len(used), b.keysIn(p))
			}
			done := 0
			for i := int64(1); i < int64(w); i++ {
				if b.keyOf(p, i) != b.keyOf(p, 0) {
					done++
				}
			}
			if done < o.concStuckAhead {
				t.Errorf("%s: a window of %d holds %d messages of other keys above partition %d's first, want %d", pick, w, done, p, o.concStuckAhead)
			}
		}
		if got := b.bound(varKey, handlerSleep100); got != 10_000 {
			t.Errorf("OrderKey's bound at 100 ms = %v, want 10,000", got)
		}
		if got := b.bound(varKeyDefault, handlerSleep100); got != 8_000 {
			t.Errorf("OrderKey's bound at 100 ms with MaxInFlight 100 = %v, want 8,000", got)
		}
	}
	if _, err := parseOptions([]string{"-concurrency-windows", "sleep5ms=1s"}, io.Discard); err == nil {
		t.Error("no error for an unknown handler mode in -concurrency-windows")
	}
	o, err := parseOptions([]string{"-concurrency-windows", "sleep100ms=2s"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.concWindows[handlerSleep100] != 2*time.Second || o.concWindows[handlerNoop] != o.maxWindow {
		t.Errorf("windows %v", o.concWindows)
	}
}

func TestReplayOptions(t *testing.T) {
	o, err := parseOptions([]string{"-replay-max-undurable", "1,100000,10,0,1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(o.replayValues); got != "[1 0 10]" {
		t.Errorf("values %s, want [1 0 10] (100000 is the default, 0)", got)
	}
	if _, err := parseOptions([]string{"-replay-max-undurable", "-1"}, io.Discard); err == nil {
		t.Error("no error for a negative MaxUndurable")
	}
	if _, err := parseOptions([]string{"-sections", "replay", "-replay-handlers", "sleep20ms"}, io.Discard); err == nil {
		t.Error("no error for a handler mode the section does not run")
	}
	for v, want := range map[float64]string{0.00057: "0.00057", 0.0123: "0.012", 0.5: "0.50", 1: "1.00"} {
		if got := smallRatioText(v); got != want {
			t.Errorf("smallRatioText(%v) = %q, want %q", v, got, want)
		}
	}
}

// TestSmokeTransactions runs the transactions section alone, small, on
// kfake, into a BENCHMARKS.md that has a kfake section already: only the
// section's block is added to it, the rest is kept.
func TestSmokeTransactions(t *testing.T) {
	if testing.Short() {
		t.Skip("runs consumers in child processes: a few seconds")
	}
	rest := "\n<!-- bench:kafka:begin (x) -->\nkafka kept\n<!-- bench:kafka:end -->\n\n## Notes\n\nhand-written, kept\n"
	smokeSection(t, rest, func(out string) []string {
		return []string{
			"-brokers=", "-sections", "transactions", "-txn-messages", "2400", "-txn-size", "50", "-txn-abort-every", "2", "-txn-rounds", "1",
			"-txn-runs", "tidemark-read-committed,tidemark-plain", "-max-window", "1s", "-out", out,
		}
	}, []string{
		"<!-- bench:kfake:transactions:begin", "Written by a run of this section alone", "go run . -brokers= -sections transactions",
		"11 transactions, 5 of them aborted, so each partition also holds 250 records of aborted transactions",
		"| tidemark, `IsolationLevel: kafka.ReadCommitted`, transactional topic |", ">= 0.9x tidemark `ReadUncommitted`",
	}, []string{"NaN", "## In-process broker", "### 100 B values", "| franz-go"})
}

// TestSmokeReplay runs the bounded replay section alone, small, on its own
// topic: its block goes inside the kfake section, whose other figures
// stay, and a MaxUndurable 1 row counts its flushes.
func TestSmokeReplay(t *testing.T) {
	if testing.Short() {
		t.Skip("runs consumers in child processes: a few seconds")
	}
	rest := "\n<!-- bench:kafka:begin (x) -->\nkafka kept\n<!-- bench:kafka:end -->\n"
	smokeSection(t, rest, func(out string) []string {
		return []string{
			"-brokers=", "-sections", "replay", "-messages", "2000", "-sizes", "100", "-replay-rounds", "1", "-replay-window", "300ms",
			"-replay-max-undurable", "1,0", "-replay-handlers", "noop", "-out", out,
		}
	}, []string{
		"<!-- bench:kfake:replay:begin", "Written by a run of this section alone", "go run . -brokers= -sections replay",
		"a topic of 8 partitions x 250 messages of 100 B", "| no-op | 1 | 8 |", "| no-op | 100,000 (the default) | 800,000 |",
	}, []string{"NaN", "## In-process broker", "### 100 B values", "| no-op | 1 | 8 | 0 |"})
}

// TestSmokeLeaderMoves runs the leader-move section alone, small: its block
// goes inside the kfake section, whose other figures stay.
func TestSmokeLeaderMoves(t *testing.T) {
	if testing.Short() {
		t.Skip("moves leaders on kfake clusters: a few seconds")
	}
	rest := "\n<!-- bench:kafka:begin (x) -->\nkafka kept\n<!-- bench:kafka:end -->\n"
	smokeSection(t, rest, func(out string) []string {
		return []string{"-brokers=", "-sections", "leadermoves", "-leadermoves-rounds", "2", "-leadermoves-moves", "4", "-out", out}
	}, []string{
		"<!-- bench:kfake:leadermoves:begin", "Written by a run of this section alone", "go run . -brokers= -sections leadermoves",
		"moved 4 times between the 3 brokers", "| tidemark | 8 |", "| franz-go | 8 |", "tidemark / franz-go, resume time per move: median **",
	}, []string{"NaN", "## In-process broker", "### 100 B values"})
}

// TestSmokeWide runs the wide section alone, small: its block goes inside
// the kfake section, whose other figures stay.
func TestSmokeWide(t *testing.T) {
	if testing.Short() {
		t.Skip("runs consumers in child processes: a few seconds")
	}
	rest := "\n<!-- bench:kafka:begin (x) -->\nkafka kept\n<!-- bench:kafka:end -->\n"
	smokeSection(t, rest, func(out string) []string {
		return []string{"-brokers=", "-sections", "wide", "-wide-partitions", "30", "-wide-messages", "600", "-wide-idle-window", "200ms", "-wide-rounds", "1", "-out", out}
	}, []string{
		"<!-- bench:kfake:wide:begin", "Written by a run of this section alone", "go run . -brokers= -sections wide",
		"### Wide topics: 30 partitions", "600 messages of 200 B", "| 30 | tidemark |", "| 30 | franz-go |",
		"| tidemark | ", "| franz-go | ", "30 partitions, 600 messages of 200 B: tidemark's time from process start to the last message <= 1.0x franz-go's",
	}, []string{"NaN", "## In-process broker", "### 100 B values"})
}

// TestSmokeRestore runs the restore section alone, small: the changelog
// filled, restored into an empty file (every key counted through
// ViewState) and consumed; its block goes inside the kfake section.
func TestSmokeRestore(t *testing.T) {
	if testing.Short() {
		t.Skip("runs consumers in child processes: a few seconds")
	}
	rest := "\n<!-- bench:kafka:begin (x) -->\nkafka kept\n<!-- bench:kafka:end -->\n"
	smokeSection(t, rest, func(out string) []string {
		return []string{"-brokers=", "-sections", "restore", "-restore-records", "4000", "-restore-rounds", "1", "-out", out}
	}, []string{
		"<!-- bench:kfake:restore:begin", "Written by a run of this section alone", "go run . -brokers= -sections restore",
		"holding 4,000 messages of 100 B", "| restore | 4,0", "| consume | 4,0",
		"restored from its changelog at >= 0.5x tidemark's own consume rate",
	}, []string{"NaN", "## In-process broker", "### 100 B values"})
}

// smokeSection runs one section alone (args, given the report's path) into
// a BENCHMARKS.md holding a kfake section and rest: the report must hold
// every string of want and none of not, and the file must be as it was but
// for the section's block, added inside the kfake section.
func smokeSection(t *testing.T, rest string, args func(out string) []string, want, not []string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	kfake := "<!-- bench:kfake:begin (x) -->\n## In-process broker: kfake\n\nkept figures\n<!-- bench:kfake:end -->\n"
	if err := os.WriteFile(out, []byte(mdHeader+kfake+rest), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	if err := run(ctx, args(out), &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	md := stdout.String()
	for _, w := range want {
		if !strings.Contains(md, w) {
			t.Errorf("report lacks %q:\n%s", w, md)
		}
	}
	for _, n := range not {
		if strings.Contains(md, n) {
			t.Errorf("report holds %q:\n%s", n, md)
		}
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	whole := mdHeader + strings.Replace(kfake, "<!-- bench:kfake:end", "\n"+md+"<!-- bench:kfake:end", 1) + rest
	// A block with Targets rows adds the summary after the sections
	// (summary.go): it is checked on its own.
	got := string(b)
	if i := strings.Index(got, "\n"+summaryBegin); i >= 0 {
		if j := strings.Index(got[i:], summaryEnd); j >= 0 {
			if strings.Contains(md, "| met |") || strings.Contains(md, "| **missed** |") {
				got = got[:i] + got[i+j+len(summaryEnd):]
			}
		}
	}
	if got != whole {
		t.Errorf("%s:\n%s\nwant:\n%s", out, got, whole)
	}
}

func TestUpdateSubsection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "B.md")
	block := func(body string) string {
		return "<!-- bench:kafka:transactions:begin (x) -->\n" + body + "\n<!-- bench:kafka:transactions:end -->\n"
	}
	// No file: the kafka section is made, with its heading and the block.
	if err := updateSubsection(path, "kafka", "transactions", block("ONE"), "## Real broker: x"); err != nil {
		t.Fatal(err)
	}
	kfake := "<!-- bench:kfake:begin (x) -->\nkfake kept\n<!-- bench:kfake:end -->\n"
	if err := updateMarkdown(path, "kfake", kfake); err != nil {
		t.Fatal(err)
	}
	if err := updateSubsection(path, "kafka", "transactions", block("TWO"), "## Real broker: x"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := mdHeader + kfake + "\n<!-- bench:kafka:begin (written by bench/, do not edit by hand) -->\n## Real broker: x\n\n" + block("TWO") + "<!-- bench:kafka:end -->\n"
	if got := string(b); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	// A full run's section replaces the block with the rest.
	if err := updateMarkdown(path, "kafka", "<!-- bench:kafka:begin (x) -->\nfull\n<!-- bench:kafka:end -->\n"); err != nil {
		t.Fatal(err)
	}
	if b, err = os.ReadFile(path); err != nil {
		t.Fatal(err)
	}
	if doc := string(b); strings.Contains(doc, "TWO") || !strings.Contains(doc, "full") || !strings.Contains(doc, "kfake kept") {
		t.Errorf("got:\n%s", doc)
	}
}

// TestCheckSequenced feeds the transactions section's handler committed
// records in order, with gaps in the offsets, then a repeat, a skip and an
// aborted record.
func TestCheckSequenced(t *testing.T) {
	s := newSink(&childSpec{Mode: modeThroughput, Partitions: 1, Want: 100, Sequenced: true}, &lineWriter{w: io.Discard})
	value := func(kind byte, seq int64) []byte {
		v := make([]byte, txnValueSize)
		txnValue(v, kind, seq)
		return v
	}
	for i, off := range []int64{0, 1, 2, 5, 6, 40} { // markers and aborted records between
		s.see(0, off, value(valueCommitted, int64(i)))
	}
	r, err := s.result()
	if err != nil {
		t.Fatal(err)
	}
	if r.OutOfOrder != 0 || r.Aborted != 0 {
		t.Fatalf("in order: OutOfOrder %d, Aborted %d", r.OutOfOrder, r.Aborted)
	}
	s.see(0, 41, value(valueCommitted, 5)) // a committed record twice
	s.see(0, 42, value(valueCommitted, 7)) // one skipped
	s.see(0, 42, value(valueCommitted, 8)) // an offset again
	s.see(0, 43, value(valueAborted, 9))
	if r, _ = s.result(); r.OutOfOrder != 3 || r.Aborted != 1 {
		t.Errorf("OutOfOrder %d (want 3), Aborted %d (want 1)", r.OutOfOrder, r.Aborted)
	}
	if _, err := parseOptions([]string{"-txn-abort-every", "1"}, io.Discard); err == nil {
		t.Error("no error for -txn-abort-every 1")
	}
	if _, err := parseOptions([]string{"-txn-runs", "sarama"}, io.Discard); err == nil {
		t.Error("no error for an unknown -txn-runs")
	}
}
