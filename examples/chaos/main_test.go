package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Bad arguments are refused before anything starts. (The runs themselves
// are TestChaos in internal/chaos, which builds and runs this command.)
func TestArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-mix", "sigkill=1,meteor=2"}, `unknown kind "meteor"`},
		{[]string{"-mix", "sigkill"}, "is not kind=weight"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"-duration", "1s", "-dir", t.TempDir()}, "at least 15s"},
		{[]string{"consume", "-group", "g"}, "missing -brokers, -instance, -ledger, -offsets, -topic"},
		{[]string{"check"}, "usage: chaos check -dir DIR"},
		{[]string{"check", "-dir", t.TempDir()}, "facts.json"},
	} {
		var out, errOut bytes.Buffer
		err := run(context.Background(), tc.args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"-h"}, &out, &errOut); !errors.Is(err, flag.ErrHelp) || !strings.Contains(errOut.String(), "-mix") {
		t.Errorf("-h: %v, usage %q", err, errOut.String())
	}
}
