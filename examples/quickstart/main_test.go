package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// checkOutput asserts that the report ends with the all-clear.
func checkOutput(t *testing.T, out string) {
	t.Helper()
	for _, re := range []string{
		`(?m)^   lost +0$`,
		`(?m)^   handled twice +0$`,
		`(?m)^   Kafka committed == local watermark == log end, on every partition$`,
		`(?m)^   .* local \d+ > Kafka \d+: resumed at \d+, Kafka committed \d+$`,
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
	checkOutput(t, out.String())
}

// TestQuickstartBrokers runs the -brokers path (fresh topic and group,
// deleted at the end, and an -offsets file) against a broker the quickstart
// did not start itself.
func TestQuickstartBrokers(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	file := filepath.Join(t.TempDir(), "offsets.db")
	// Twice on the same offset file: each run has its own group.
	for range 2 {
		var out bytes.Buffer
		args := []string{"-brokers", cluster.ListenAddrs()[0], "-messages", "150", "-partitions", "3", "-offsets", file}
		if err := run(ctx, args, &out); err != nil {
			t.Fatalf("run: %v\n%s", err, out.String())
		}
		checkOutput(t, out.String())
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
