// Command tidemark reads and repairs tidemark offset files, on a running or
// a stopped consumer.
//
//	go install github.com/tidemark/tidemark/cmd/tidemark@latest
//
// Subcommands (tidemark help SUBCOMMAND for each one's flags):
//
//	inspect FILE [--group G] [--topic T] [--json]
//	    per group and topic, per partition: local watermark, last commit
//	    to Kafka as the file knows it, when, generation, member, state,
//	    offsets completed above the watermark; a TxHandler's state size
//	    and changelog position
//	diff FILE --brokers B [--group G] [--topic T] [--max-pending D]
//	     [--out-of-range P] [--start-offset S] [--read-committed] [--json]
//	    the file against Kafka: committed offsets, log start and end, and
//	    what the consumer's next start does (reconciliation's own decision)
//	check FILE [--json]
//	    bbolt's structural check, the schema, every value, invariants
//	export FILE > offsets.json
//	import FILE [--force] [--dry-run] < offsets.json
//	    the records with their states; import refuses, without --force,
//	    to lose completed offsets or a state
//	set FILE --group G --topic T --partition P --offset N [--dry-run]
//	    offline repair; the next start resumes at the greater of N and
//	    Kafka's committed offset
//	serve FILE [--addr 127.0.0.1:8080]
//	    the status page over HTTP (the page of Consumer.StatusHandler),
//	    until SIGINT or SIGTERM
//
// The read commands (inspect, diff, export, serve) work while a consumer holds the
// file: they ask it for a snapshot over the socket named in the side file
// FILE.inspect (see internal/inspect). Without a running consumer
// they open the file read-only, for at most a second or so. They never
// write to the file. check needs the file's lock, so it runs on a stopped
// consumer; import and set write the file, and refuse while it is in use.
//
// Help (tidemark help SUBCOMMAND, -h) goes to stdout, usage errors to
// stderr. Exit status: 0 success, 1 a finding (check, diff), 2 a usage or input
// error (bad flags, a file that is missing, not an offset file, or in use;
// a broker that cannot be reached). Build the command (go build, go
// install) for scripts: `go run` reports every failing status as 1.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	os.Exit(report(err, os.Stderr))
}

// report prints err and returns the exit status for it.
func report(err error, stderr io.Writer) int {
	if err == nil {
		return 0
	}
	code := 2
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
		if ee.silent {
			return code
		}
	}
	fmt.Fprintln(stderr, "tidemark:", err)
	return code
}

// Exit statuses.
const (
	exitFinding = 1
	exitUsage   = 2
)

// exitError carries the exit status for an error that run returns.
type exitError struct {
	code int
	err  error
	// silent: the message was printed already (usage).
	silent bool
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// inputErr is an error of the input (a file, a broker, flags): exit 2.
func inputErr(err error) error { return &exitError{code: exitUsage, err: err} }

// findingErr reports findings: exit 1.
func findingErr(format string, args ...any) error {
	return &exitError{code: exitFinding, err: fmt.Errorf(format, args...)}
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"inspect", "show the offset file, live from a running consumer or from the file", runInspect},
		{"diff", "compare the offset file with Kafka's committed offsets and log bounds", runDiff},
		{"check", "check the file's structure, schema, values and invariants", runCheck},
		{"export", "write the file's records as JSON to stdout", runExport},
		{"import", "read records as JSON from stdin into the file", runImport},
		{"set", "set one partition's watermark (offline repair)", runSet},
		{"serve", "serve the status page over HTTP, live from a running consumer or from the file", runServe},
	}
}

const topUsage = `usage: tidemark SUBCOMMAND FILE [flags]

Reads and repairs tidemark offset files, on a running or a stopped consumer.

Subcommands:
%s
Run 'tidemark help SUBCOMMAND' for its flags.
Exit status: 0 success, 1 a finding (check, diff), 2 a usage or input error.
`

func printTopUsage(w io.Writer) {
	var b strings.Builder
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, topUsage, b.String())
}

// run is the whole command; main only maps its error to an exit status.
func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		printTopUsage(stderr)
		return &exitError{code: exitUsage, err: errors.New("no subcommand"), silent: true}
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) == 0 {
			printTopUsage(stdout)
			return nil
		}
		name, rest = rest[0], []string{"-h"}
	}
	i := slices.IndexFunc(commands(), func(c command) bool { return c.name == name })
	if i < 0 {
		printTopUsage(stderr)
		return &exitError{code: exitUsage, err: fmt.Errorf("unknown subcommand %q", name)}
	}
	return commands()[i].run(rest, stdout, &streams{Writer: stderr, stdout: stdout})
}

// streams is the stderr run gives a subcommand: it writes to stderr, and
// carries stdout for the subcommand's flag set, which prints the help (-h,
// tidemark help SUBCOMMAND) there.
type streams struct {
	io.Writer
	stdout io.Writer
}
