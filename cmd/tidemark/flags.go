package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// flagSet is a subcommand's flags, with its synopsis and description for
// the usage text.
type flagSet struct {
	*flag.FlagSet
	synopsis, description string
	// stdout takes the help (-h), stderr the usage after a usage error.
	stdout, stderr io.Writer
}

// newFlags returns the flag set of a subcommand. stderr is the one run
// gave the subcommand: it carries the command's stdout, where -h prints the
// help (a plain io.Writer gets the help too).
func newFlags(name, synopsis, description string, stderr io.Writer) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &flagSet{FlagSet: fs, synopsis: synopsis, description: description, stdout: stderr, stderr: stderr}
	if s, ok := stderr.(*streams); ok {
		f.stdout = s.stdout
	}
	// Parse prints the usage itself on -h and on an error; parse prints
	// it instead, to stdout or stderr.
	fs.Usage = func() {}
	return f
}

// printUsage prints the synopsis, the description and the flags to w.
func (f *flagSet) printUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: tidemark %s\n\n%s\n", f.synopsis, strings.TrimSpace(f.description))
	var any bool
	f.VisitAll(func(*flag.Flag) { any = true })
	if any {
		fmt.Fprintln(w, "\nFlags:")
		f.SetOutput(w)
		f.PrintDefaults()
		f.SetOutput(f.stderr)
	}
}

// parse parses args, flags and positional arguments in any order, and
// returns the positional ones; there must be exactly want of them. -h
// prints the usage to stdout and returns an exitError with status 0; a
// usage error prints it to stderr.
func (f *flagSet) parse(args []string, want int, what string) ([]string, error) {
	var pos []string
	for {
		if err := f.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				f.printUsage(f.stdout)
				return nil, &exitError{code: 0, err: err, silent: true}
			}
			// flag has printed the error.
			f.printUsage(f.stderr)
			return nil, &exitError{code: exitUsage, err: err, silent: true}
		}
		if f.NArg() == 0 {
			break
		}
		pos = append(pos, f.Arg(0))
		args = f.Args()[1:]
	}
	if len(pos) != want {
		if len(pos) < want {
			return nil, f.usageErr("missing %s", what)
		}
		return nil, f.usageErr("unexpected arguments %q", pos[want:])
	}
	return pos, nil
}

// usageErr prints the message and the usage to stderr and returns an
// error with exit status 2.
func (f *flagSet) usageErr(format string, args ...any) error {
	err := fmt.Errorf(format, args...)
	fmt.Fprintf(f.stderr, "tidemark %s: %v\n", f.Name(), err)
	f.printUsage(f.stderr)
	return &exitError{code: exitUsage, err: err, silent: true}
}
