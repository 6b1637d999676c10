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
	synopsis string
	stderr   io.Writer
}

func newFlags(name, synopsis, description string, stderr io.Writer) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := &flagSet{FlagSet: fs, synopsis: synopsis, stderr: stderr}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: tidemark %s\n\n%s\n", synopsis, strings.TrimSpace(description))
		var any bool
		fs.VisitAll(func(*flag.Flag) { any = true })
		if any {
			fmt.Fprintln(fs.Output(), "\nFlags:")
			fs.PrintDefaults()
		}
	}
	return f
}

// parse parses args, flags and positional arguments in any order, and
// returns the positional ones; there must be exactly want of them. -h
// prints the usage to stdout and returns an exitError with status 0.
func (f *flagSet) parse(args []string, want int, what string) ([]string, error) {
	var pos []string
	for {
		if err := f.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, &exitError{code: 0, err: err, silent: true}
			}
			// flag has printed the error and the usage.
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
	f.Usage()
	return &exitError{code: exitUsage, err: err, silent: true}
}
