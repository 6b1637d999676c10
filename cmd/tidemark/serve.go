package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

const serveHelp = `
Serves the status page of the offset file over HTTP, the same page a
consumer serves with Config.StatusAddr: /status, a
page that refreshes itself every few seconds, and /status.json, the
snapshot (?failures=1 adds the failure entries); / redirects to /status.
Read-only: GET and HEAD only.

Each request reads afresh, as inspect does: from the consumer running on
FILE, through its inspect socket (FILE.inspect), with its live state per
partition; or, when none runs, from the file itself, opened read-only for
the read (so the page shows the file's changes, and a consumer starting
meanwhile waits at most that long for the lock). The file alone has no live
state: the page shows its records (watermark, commit ledger, completed
ranges, failure counts, run state) and says "offset file only: the consumer
is not running". It has no /healthz or /readyz: those are the consumer's
own (Config.StatusAddr).

The address is loopback unless told otherwise: a host-less ":8080" listens
on 127.0.0.1:8080. serve stops on SIGINT (Ctrl-C) or SIGTERM.
`

// serveAddr is where serve listens: a host-less ":PORT" on 127.0.0.1.
func serveAddr(s string) (string, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", fmt.Errorf("--addr %q is not a host:port address: %v", s, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("--addr %q: the port must be a number from 0 to 65535", s)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

func runServe(args []string, stdout, stderr io.Writer) error {
	f := newFlags("serve", "serve FILE [--addr 127.0.0.1:8080]", serveHelp, stderr)
	addr := f.String("addr", "127.0.0.1:8080", "listen `address` (host:port; port 0 picks a free one)")
	pos, err := f.parse(args, 1, "FILE")
	if err != nil {
		return err
	}
	path := pos[0]
	where, err := serveAddr(*addr)
	if err != nil {
		return f.usageErr("%v", err)
	}
	// A first read, so that a file that cannot be shown fails here.
	src, err := load(path, want{})
	if err != nil {
		return err
	}
	page, err := inspect.StatusPage(fileSnapshot(path))
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	l, err := net.Listen("tcp", where)
	if err != nil {
		return inputErr(fmt.Errorf("serve: %w", err))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{
		Handler:           page,
		ReadHeaderTimeout: 2 * time.Second,
		ReadTimeout:       5 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    8 << 10,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	fmt.Fprintf(stdout, "serving the status page of %s at http://%s/status (now: %s); Ctrl-C or SIGTERM stops\n",
		path, l.Addr(), src.how)
	select {
	case <-ctx.Done():
	case err := <-served:
		return inputErr(fmt.Errorf("serve: %w", err))
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if srv.Shutdown(sctx) != nil {
		_ = srv.Close()
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return inputErr(fmt.Errorf("serve: %w", err))
	}
	fmt.Fprintln(stdout, "stopped")
	return nil
}

// fileSnapshot reads the snapshot at every call, as inspect does: the
// running consumer's, or the file's alone (Pid 0, no Stats).
func fileSnapshot(path string) inspect.Source[framework.Stats] {
	return func(_ context.Context, withFailures bool) (*snapshot, error) {
		src, err := load(path, want{failures: withFailures}) // bounded: about 2.5 s at worst
		if err != nil {
			return nil, err
		}
		if src.live != nil {
			return src.live, nil
		}
		abs, err := filepath.Abs(path)
		if err != nil {
			abs = path
		}
		snap := &snapshot{Format: inspect.Format, Version: inspect.SnapshotVersion,
			OffsetFile: abs, TakenAt: now().UTC(), Records: src.records}
		keys := make([]offsetfile.Key, 0, len(src.failures))
		for k := range src.failures {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, compareKeys)
		for _, k := range keys {
			snap.Failures = append(snap.Failures, inspect.Failures{Key: k, Failures: src.failures[k]})
		}
		return snap, nil
	}
}
