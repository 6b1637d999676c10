package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

// Time bounds of the read commands: at most liveTimeout asking a running
// consumer, then at most lockTimeout waiting for the file's lock.
var (
	liveTimeout = 1500 * time.Millisecond
	lockTimeout = time.Second
)

// snapshot is a running consumer's snapshot, read from its inspect socket.
type snapshot = inspect.Snapshot[framework.Stats]

// source is what the read commands show: the file's durable records, read
// from the file or from the running consumer that holds it.
type source struct {
	path string
	// live is the running consumer's snapshot; nil when the file was read
	// directly.
	live     *snapshot
	records  []offsetfile.Entry
	failures map[offsetfile.Key][]offsetfile.Failure // when asked for
	// sizes are the partitions' state sizes (a TxHandler's), when asked
	// for; sizesErr says why there are none when a running consumer was
	// asked and did not send them (inspect.ErrStateNotServed: a build from
	// before them).
	sizes    []offsetfile.StateSize
	sizesErr error
	// states are the partitions' states whole, when asked for: read from
	// the file only, since a running consumer does not serve them.
	states map[offsetfile.Key]*offsetfile.StateDump
	// how says where the records came from, for the reader.
	how string
}

// want is what load reads beyond the records.
type want struct {
	failures bool // the failure entries
	sizes    bool // the state sizes
	// states are the states whole, from the file; from a running
	// consumer, which does not serve them, the state sizes instead, to
	// tell whether it keeps any.
	states bool
}

// preflight rejects, before anything opens it, a path that cannot be an
// offset file: missing, a directory, a FIFO or device (opening one could
// block), or empty. It only stats the path.
func preflight(path string) error {
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return inputErr(fmt.Errorf("%s: no such file", path))
	case err != nil:
		return inputErr(err)
	case fi.IsDir():
		return inputErr(fmt.Errorf("%s: is a directory, not an offset file (the file is the Config.OffsetFile path, e.g. %s)",
			path, filepath.Join(path, "offsets.db")))
	case !fi.Mode().IsRegular():
		return inputErr(fmt.Errorf("%s: not a regular file (%s), not an offset file", path, fileType(fi.Mode())))
	case fi.Size() == 0:
		return inputErr(fmt.Errorf("%s: 0 bytes, empty: no history; a consumer refuses it (it may have lost its history); "+
			"move it aside or delete it to start with no history", path))
	}
	return nil
}

// loadSalvage reads what can be read of a damaged file (export --salvage):
// the file itself, never a running consumer's snapshot, since a consumer
// does not run on a damaged file. It returns what could not be read.
func loadSalvage(path string) (*source, []string, error) {
	if err := preflight(path); err != nil {
		return nil, nil, err
	}
	sv, err := offsetfile.Salvage(path, &offsetfile.Options{Timeout: lockTimeout})
	if err != nil {
		return nil, nil, inUse(path, err)
	}
	src := &source{path: path, records: sv.Records, failures: sv.Failures, states: sv.States, how: "the file, salvaged"}
	return src, sv.Problems, nil
}

func fileType(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.String()
}

// load reads the durable records of the file at path, and what w asks
// for: from the consumer running on it if there is one (its side file
// names where), otherwise from the file, opened read-only.
func load(path string, w want) (*source, error) {
	if err := preflight(path); err != nil {
		return nil, err
	}
	src := &source{path: path}
	ep, why := liveEndpoint(path)
	if ep != nil {
		ctx, cancel := context.WithTimeout(context.Background(), liveTimeout)
		snap, err := inspect.Fetch[framework.Stats](ctx, ep, w.failures)
		if err == nil && (w.sizes || w.states) {
			var sizes *inspect.StateSizes
			if sizes, src.sizesErr = inspect.FetchStateSizes(ctx, ep); src.sizesErr == nil {
				src.sizes = sizes.Partitions
			}
		}
		cancel()
		if err == nil {
			src.live, src.records = snap, snap.Records
			src.how = fmt.Sprintf("live snapshot from the consumer running as pid %d (since %s)", snap.Pid, fmtTime(snap.Started))
			if w.failures {
				src.failures = map[offsetfile.Key][]offsetfile.Failure{}
				for _, f := range snap.Failures {
					src.failures[f.Key] = f.Failures
				}
			}
			return src, nil
		}
		why = fmt.Sprintf("the consumer named in %s (pid %d) did not answer: %v", path+inspect.SideFileSuffix, ep.Pid, err)
	}

	st, err := offsetfile.Open(path, &offsetfile.Options{ReadOnly: true, Timeout: lockTimeout})
	if err != nil {
		if errors.Is(err, offsetfile.ErrInUse) {
			if why == "" {
				why = "it publishes no live snapshot (Config.InspectSocket \"-\", or see its log)"
			}
			return nil, inputErr(fmt.Errorf("%s is in use by another process and %s", path, why))
		}
		return nil, inputErr(err)
	}
	defer st.Close()
	src.records = st.Records()
	if w.sizes {
		if src.sizes, err = st.StateSizes(); err != nil {
			return nil, inputErr(err)
		}
	}
	if w.states {
		if src.states, err = st.DumpStates(); err != nil {
			return nil, inputErr(err)
		}
	}
	if w.failures {
		src.failures = map[offsetfile.Key][]offsetfile.Failure{}
		for _, e := range src.records {
			if e.Skipped+e.DeadLettered == 0 {
				continue
			}
			f, err := st.Failures(e.Key)
			if err != nil {
				return nil, inputErr(err)
			}
			src.failures[e.Key] = f
		}
	}
	src.how = "the file (no consumer holds it)"
	if why != "" {
		src.how += "; " + why
	}
	return src, nil
}

// liveEndpoint returns the inspect endpoint of a consumer running on path,
// or nil and, if there is a side file, why it is not used.
func liveEndpoint(path string) (*inspect.Endpoint, string) {
	ep, err := inspect.ReadEndpoint(path)
	switch {
	case errors.Is(err, inspect.ErrNoEndpoint):
		return nil, ""
	case err != nil:
		return nil, fmt.Sprintf("side file unusable: %v", err)
	}
	side := path + inspect.SideFileSuffix
	if !sameFile(ep.OffsetFile, path) {
		return nil, fmt.Sprintf("side file %s names another offset file, %s", side, ep.OffsetFile)
	}
	if alive, known := processAlive(ep.Pid); known && !alive {
		return nil, fmt.Sprintf("stale side file %s: pid %d is not running (the consumer did not stop cleanly)", side, ep.Pid)
	}
	return ep, ""
}

func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// inUse explains, for the commands that need the file's lock, who holds
// it.
func inUse(path string, err error) error {
	if !errors.Is(err, offsetfile.ErrInUse) {
		return inputErr(err)
	}
	holder := "another process"
	if ep, _ := liveEndpoint(path); ep != nil {
		holder = fmt.Sprintf("the consumer running as pid %d", ep.Pid)
	}
	return inputErr(fmt.Errorf("%s is in use by %s: stop it first", path, holder))
}
