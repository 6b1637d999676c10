//go:build ignore

// skips reads `go test -json` on stdin and prints what plain `go test` would
// (the output of failed tests, the packages' ok and FAIL lines, everything
// that is not JSON as it is; with -v every test's output), then lists every
// test that skipped, with its reason. A skip that the allowlist does not
// name for this step breaks CI: a test meant to run there did not.
//
//	go test -json ./... | go run .ci/skips.go -step test -allow .ci/skips-allowed
//
// The allowlist has one line per test allowed to skip: the step (or * for
// every step), the test's name as go test reports it (Parent/sub for a
// subtest), and the reason. -allow-also TEST=REASON adds one for this run
// (an optional tool CI could not install). -log FILE appends the list, for
// the summary at the end of CI. The exit status is 1 when a test skipped
// that may not, else 0; go test's own status is the pipeline's.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
)

type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

type key struct{ pkg, test string }

type skip struct {
	key
	reason string
}

type allowFlag map[string]string

func (a allowFlag) String() string { return "" }

func (a allowFlag) Set(s string) error {
	name, reason, ok := strings.Cut(s, "=")
	if !ok || name == "" || reason == "" {
		return fmt.Errorf("want TEST=REASON, got %q", s)
	}
	a[name] = reason
	return nil
}

func main() {
	step := flag.String("step", "", "the CI step, as the allowlist names it")
	allowFile := flag.String("allow", "", "the allowlist file")
	logFile := flag.String("log", "", "append the skipped tests to this file")
	verbose := flag.Bool("v", false, "print every test's output, as go test -v")
	also := allowFlag{}
	flag.Var(also, "allow-also", "TEST=REASON: allow one more skip in this run (repeatable)")
	flag.Parse()
	if *step == "" {
		fmt.Fprintln(os.Stderr, "skips: -step is required")
		os.Exit(2)
	}
	allowed, err := readAllow(*allowFile, *step)
	if err != nil {
		fmt.Fprintln(os.Stderr, "skips:", err)
		os.Exit(2)
	}
	for name, reason := range also {
		allowed[name] = reason
	}

	out := bufio.NewWriter(os.Stdout)
	buf := map[key][]string{}
	var skips []skip
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	for in.Scan() {
		line := in.Text()
		var e event
		if !strings.HasPrefix(line, "{") || json.Unmarshal([]byte(line), &e) != nil || e.Action == "" {
			fmt.Fprintln(out, line)
			out.Flush()
			continue
		}
		k := key{e.Package, e.Test}
		switch {
		case e.Test == "":
			// Package lines (ok, FAIL, a panic outside a test), build output.
			if e.Output != "" && (*verbose || e.Output != "PASS\n") {
				fmt.Fprint(out, e.Output)
				out.Flush()
			}
		case e.Action == "output":
			if *verbose {
				fmt.Fprint(out, e.Output)
				out.Flush()
			} else {
				buf[k] = append(buf[k], e.Output)
			}
		case e.Action == "fail":
			for _, l := range buf[k] {
				fmt.Fprint(out, l)
			}
			out.Flush()
			delete(buf, k)
		case e.Action == "skip":
			skips = append(skips, skip{k, reason(buf[k])})
			delete(buf, k)
		case e.Action == "pass":
			delete(buf, k)
		}
	}
	out.Flush()
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "skips: reading go test's output:", err)
		os.Exit(2)
	}

	sort.Slice(skips, func(i, j int) bool {
		if skips[i].pkg != skips[j].pkg {
			return skips[i].pkg < skips[j].pkg
		}
		return skips[i].test < skips[j].test
	})
	var report strings.Builder
	bad := 0
	fmt.Fprintf(&report, "skipped tests in %s: %d\n", *step, len(skips))
	for _, s := range skips {
		mark := "allowed"
		if _, ok := allowed[s.test]; !ok {
			mark = "NOT ALLOWED"
			bad++
		}
		fmt.Fprintf(&report, "  %-11s %s %s: %s\n", mark, s.pkg, s.test, s.reason)
	}
	if bad > 0 {
		fmt.Fprintf(&report, "  %d tests skipped that %s is meant to run: install what they need, or add them to .ci/skips-allowed with the reason\n", bad, *step)
	}
	fmt.Print("\n" + report.String())
	if *logFile != "" {
		f, err := os.OpenFile(*logFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			_, err = f.WriteString(report.String())
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "skips:", err)
			os.Exit(2)
		}
	}
	if bad > 0 {
		os.Exit(1)
	}
}

// reason is a skipped test's own output less go test's framing lines: the
// message t.Skip gave, with its file and line.
func reason(lines []string) string {
	var parts []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		parts = append(parts, t)
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " ")
}

// readAllow reads the allowlist's entries for step: "STEP TEST REASON...".
func readAllow(path, step string) (map[string]string, error) {
	allowed := map[string]string{}
	if path == "" {
		return allowed, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, fmt.Errorf("%s:%d: want STEP TEST REASON, got %q", path, i+1, line)
		}
		if f[0] == step || f[0] == "*" {
			allowed[f[1]] = strings.Join(f[2:], " ")
		}
	}
	return allowed, nil
}
