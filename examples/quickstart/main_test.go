package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tidemark/tidemark/tidemarktest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// checkOutput asserts that the report ends with the all-clear, and that
// the restart resumed at the offset file's watermark, ahead of Kafka (op
// ">") or level with it ("=").
func checkOutput(t *testing.T, out, op string) {
	t.Helper()
	for _, re := range []string{
		`(?m)^   lost +0$`,
		`(?m)^   handled twice +0$`,
		`(?m)^   Kafka committed == local watermark == log end, on every partition$`,
		`(?m)^   .* local (\d+) ` + op + ` Kafka \d+: resumed at \d+, Kafka committed \d+$`,
		`(?m)^OK in `,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("output does not match %s:\n%s", re, out)
		}
	}
}

func TestQuickstart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, []string{"-messages", "400"}, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	checkOutput(t, out.String(), ">")
	// The in-process broker refused commits for real.
	if !regexp.MustCompile(`(?m)^   \d+ of 400 handled, [1-9]\d* commits refused`).MatchString(out.String()) {
		t.Errorf("no commit refused:\n%s", out.String())
	}
}

// TestQuickstartBrokers runs the -brokers path (fresh topic and group,
// deleted at the end, and an -offsets file) against a broker the
// quickstart did not start itself: tidemarktest's, a real cluster when
// KAFKA_BROKERS is set. Its commits do not fail, so the restart finds
// Kafka level with the file.
func TestQuickstartBrokers(t *testing.T) {
	b := tidemarktest.NewBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	file := filepath.Join(t.TempDir(), "offsets.db")
	// Twice on the same offset file: each run has its own group.
	for range 2 {
		var out bytes.Buffer
		args := []string{"-brokers", strings.Join(b.Brokers(), ","), "-messages", "150", "-partitions", "3", "-offsets", file}
		if err := run(ctx, args, &out); err != nil {
			t.Fatalf("run: %v\n%s", err, out.String())
		}
		checkOutput(t, out.String(), "=")
		t.Logf("\n%s", out.String())
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{{"-messages", "1"}, {"-partitions", "0"}, {"extra"}, {"-nope"}} {
		if err := run(context.Background(), args, &bytes.Buffer{}); err == nil {
			t.Errorf("run(%q) = nil, want an error", args)
		}
	}
	if err := run(context.Background(), []string{"-h"}, &bytes.Buffer{}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("run(-h) = %v, want flag.ErrHelp", err)
	}
}
