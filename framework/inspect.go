package framework

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tidemark/tidemark/offsetstore"
)

// Live inspection.
//
// While Run runs, the Consumer serves a read-only JSON snapshot of its
// offset file and of its Stats over HTTP, for `tidemark inspect` and the
// other read commands of cmd/tidemark: a running consumer holds the file's
// lock, so no other process may open the file, not even read-only.
//
// Where: Config.InspectSocket. The default is a unix socket next to the
// offset file, OffsetFile+".sock" (a loopback TCP port if that path is too
// long for a unix socket). The address is published in a side file,
// OffsetFile+".inspect" (InspectEndpoint as JSON, mode 0600, written
// atomically when Run starts and removed when it returns), together with
// the pid and a random token that every request must carry: only a user
// who can read the side file can read the snapshot. After a crash the
// side file stays behind; readers detect that the address no longer
// answers, and the next Run replaces it.
//
// The server only reads: the durable records (offsetstore.Store.Records,
// from memory), the failure entries on request (a bbolt read transaction,
// which never blocks the writer) and Stats. It never writes the file.

// Inspect protocol constants.
const (
	// InspectSideFileSuffix is appended to the offset file's path to name
	// the side file that publishes the inspect address.
	InspectSideFileSuffix = ".inspect"
	// InspectSocketSuffix is appended to the offset file's path to name the
	// default unix socket.
	InspectSocketSuffix = ".sock"
	// InspectDisabled, as Config.InspectSocket, serves no snapshot.
	InspectDisabled = "-"
	// InspectVersion is the version of InspectEndpoint (the side file).
	InspectVersion = 1
	// InspectSnapshotVersion is the version of InspectSnapshot. Version 2
	// pinned the field names (snake_case) and encodes outcomes and actions
	// as strings; version 1 carried Go field names.
	InspectSnapshotVersion = 2
	// InspectPath is the snapshot's HTTP path; "?failures=1" adds the
	// failure entries.
	InspectPath = "/v1/snapshot"
)

// InspectEndpoint is the content of the side file.
type InspectEndpoint struct {
	Version    int       `json:"version"`
	Pid        int       `json:"pid"`
	Network    string    `json:"network"` // "unix" or "tcp"
	Address    string    `json:"address"`
	Token      string    `json:"token"`
	OffsetFile string    `json:"offset_file"` // absolute
	Started    time.Time `json:"started"`
}

// InspectSnapshot is the document served at InspectPath.
type InspectSnapshot struct {
	Format     string    `json:"format"` // "tidemark-inspect"
	Version    int       `json:"version"`
	Pid        int       `json:"pid"`
	OffsetFile string    `json:"offset_file"`
	Topics     []string  `json:"topics"`
	Started    time.Time `json:"started"`
	TakenAt    time.Time `json:"taken_at"`
	// Stats is the consumer's Stats, serialised field by field.
	Stats Stats `json:"stats"`
	// Records are the offset file's durable records.
	Records []offsetstore.Entry `json:"records"`
	// Failures are the failure entries of every record with a failure
	// count, when asked for.
	Failures []InspectFailures `json:"failures,omitempty"`
}

// InspectFailures are the failure entries of one partition.
type InspectFailures struct {
	offsetstore.Key
	Failures []offsetstore.Failure
}

// validInspectSocket checks Config.InspectSocket.
func validInspectSocket(s string) error {
	switch {
	case s == "" || s == InspectDisabled:
		return nil
	case strings.HasPrefix(s, "tcp:"):
		host, _, err := net.SplitHostPort(strings.TrimPrefix(s, "tcp:"))
		if err != nil {
			return fmt.Errorf("%q: %v", s, err)
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return fmt.Errorf("%q: only a loopback address may serve the snapshot", s)
		}
		return nil
	case len(s) > maxUnixPath:
		return fmt.Errorf("unix socket path is %d bytes, the limit is %d", len(s), maxUnixPath)
	}
	return nil
}

// maxUnixPath is the longest unix socket path every unix accepts (sun_path
// is 104 bytes on the BSDs and macOS, 108 on Linux, both with the NUL).
const maxUnixPath = 103

// inspectListen listens where Config.InspectSocket says.
func (c *Consumer) inspectListen(offsetFile string) (net.Listener, error) {
	where := c.cfg.InspectSocket
	if strings.HasPrefix(where, "tcp:") {
		return net.Listen("tcp", strings.TrimPrefix(where, "tcp:"))
	}
	if where == "" {
		where = offsetFile + InspectSocketSuffix
		if len(where) > maxUnixPath {
			return net.Listen("tcp", "127.0.0.1:0")
		}
	}
	// The offset file's lock is ours: a socket left there is a crashed
	// run's. Never remove anything but a socket.
	if fi, err := os.Lstat(where); err == nil && fi.Mode().Type() == fs.ModeSocket {
		_ = os.Remove(where)
	}
	l, err := net.Listen("unix", where)
	if err != nil {
		if where == offsetFile+InspectSocketSuffix && c.cfg.InspectSocket == "" {
			// No unix sockets here (or not in this folder): loopback TCP.
			if tl, terr := net.Listen("tcp", "127.0.0.1:0"); terr == nil {
				return tl, nil
			}
		}
		return nil, err
	}
	_ = os.Chmod(where, 0o600)
	return l, nil
}

// serveInspect starts the snapshot server and writes the side file. stop
// shuts the server down, waits for its goroutines and removes the side
// file; it must be called before the store is closed. A failure to listen
// or to write the side file is logged, not returned: the consumer runs
// without live inspection.
func (c *Consumer) serveInspect() (stop func()) {
	if c.cfg.InspectSocket == InspectDisabled {
		return func() {}
	}
	log := c.log.Named("inspect")
	offsetFile, err := filepath.Abs(c.store.Path())
	if err != nil {
		offsetFile = c.store.Path()
	}
	l, err := c.inspectListen(offsetFile)
	if err != nil {
		log.Warn("live inspection off: cannot listen", zap.Error(err))
		return func() {}
	}
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	ep := InspectEndpoint{
		Version:    InspectVersion,
		Pid:        os.Getpid(),
		Network:    l.Addr().Network(),
		Address:    l.Addr().String(),
		Token:      hex.EncodeToString(tok[:]),
		OffsetFile: offsetFile,
		Started:    time.Now().UTC(),
	}
	side := offsetFile + InspectSideFileSuffix
	if err := writeSideFile(side, &ep); err != nil {
		_ = l.Close()
		log.Warn("live inspection off: cannot write the side file", zap.String("side_file", side), zap.Error(err))
		return func() {}
	}
	srv := &http.Server{
		Handler:           c.inspectHandler(&ep),
		ReadHeaderTimeout: 2 * time.Second,
		WriteTimeout:      30 * time.Second,
		ErrorLog:          zap.NewStdLog(log.WithOptions(zap.IncreaseLevel(zap.WarnLevel))),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l) // returns ErrServerClosed after Shutdown
	}()
	log.Info("serving live inspection", zap.String("network", ep.Network), zap.String("address", ep.Address), zap.String("side_file", side))
	var once sync.Once
	return func() {
		once.Do(func() {
			_ = os.Remove(side)
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if srv.Shutdown(ctx) != nil {
				_ = srv.Close()
			}
			cancel()
			<-done
		})
	}
}

// writeSideFile writes the side file atomically, mode 0600.
func writeSideFile(path string, ep *InspectEndpoint) error {
	b, err := json.MarshalIndent(ep, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o600) // CreateTemp's mode, made explicit
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

func (c *Consumer) inspectHandler(ep *InspectEndpoint) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+InspectPath, func(w http.ResponseWriter, r *http.Request) {
		auth := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if subtle.ConstantTimeCompare([]byte(auth), []byte(ep.Token)) != 1 {
			http.Error(w, "missing or wrong token (see the side file)", http.StatusUnauthorized)
			return
		}
		snap, err := c.inspectSnapshot(ep, r.URL.Query().Get("failures") == "1")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(snap)
	})
	return mux
}

func (c *Consumer) inspectSnapshot(ep *InspectEndpoint, withFailures bool) (*InspectSnapshot, error) {
	snap := &InspectSnapshot{
		Format:     "tidemark-inspect",
		Version:    InspectSnapshotVersion,
		Pid:        ep.Pid,
		OffsetFile: ep.OffsetFile,
		Topics:     c.cfg.Topics,
		Started:    ep.Started,
		TakenAt:    time.Now().UTC(),
		Stats:      c.Stats(),
		Records:    c.store.Records(),
	}
	if withFailures {
		for _, e := range snap.Records {
			if e.Skipped+e.DeadLettered == 0 {
				continue
			}
			entries, err := c.store.Failures(e.Key)
			if err != nil {
				return nil, err
			}
			snap.Failures = append(snap.Failures, InspectFailures{Key: e.Key, Failures: entries})
		}
	}
	return snap, nil
}

// ErrNoInspectEndpoint is returned by ReadInspectEndpoint when the offset
// file has no side file: no consumer serves it (none runs, live inspection
// is off, or the consumer stopped cleanly).
var ErrNoInspectEndpoint = errors.New("no inspect side file")

// maxSideFile bounds the side file a reader accepts.
const maxSideFile = 64 << 10

// ReadInspectEndpoint reads the side file of the offset file at path. It
// returns an error wrapping ErrNoInspectEndpoint when there is none.
func ReadInspectEndpoint(offsetFile string) (*InspectEndpoint, error) {
	side := offsetFile + InspectSideFileSuffix
	fi, err := os.Lstat(side)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%s: %w", side, ErrNoInspectEndpoint)
	case err != nil:
		return nil, err
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%s: not a regular file (mode %v)", side, fi.Mode())
	case fi.Size() > maxSideFile:
		return nil, fmt.Errorf("%s: %d bytes, not a side file", side, fi.Size())
	}
	b, err := os.ReadFile(side)
	if err != nil {
		return nil, err
	}
	var ep InspectEndpoint
	if err := json.Unmarshal(b, &ep); err != nil {
		return nil, fmt.Errorf("%s: %w", side, err)
	}
	if ep.Version != InspectVersion {
		return nil, fmt.Errorf("%s: version %d, this build reads %d", side, ep.Version, InspectVersion)
	}
	if ep.Network != "unix" && ep.Network != "tcp" {
		return nil, fmt.Errorf("%s: unknown network %q", side, ep.Network)
	}
	return &ep, nil
}

// Snapshot fetches the snapshot from the endpoint; ctx bounds the whole
// exchange. withFailures adds the failure entries.
func (ep *InspectEndpoint) Snapshot(ctx context.Context, withFailures bool) (*InspectSnapshot, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, ep.Network, ep.Address)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	url := "http://tidemark" + InspectPath
	if withFailures {
		url += "?failures=1"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+ep.Token)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("inspect endpoint %s %s: %w", ep.Network, ep.Address, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, fmt.Errorf("inspect endpoint %s %s: %s: %s", ep.Network, ep.Address, resp.Status, strings.TrimSpace(string(msg)))
	}
	var snap InspectSnapshot
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
		return nil, fmt.Errorf("inspect endpoint %s %s: decoding the snapshot: %w", ep.Network, ep.Address, err)
	}
	if snap.Format != "tidemark-inspect" || snap.Version != InspectSnapshotVersion {
		return nil, fmt.Errorf("inspect endpoint %s %s: format %q version %d, this build reads tidemark-inspect version %d",
			ep.Network, ep.Address, snap.Format, snap.Version, InspectSnapshotVersion)
	}
	return &snap, nil
}

// The snapshot's wire format. Stats and its parts carry json tags
// (snake_case), which pin their names; offsetstore's records are encoded
// through the types below, where outcomes and actions are strings, so that
// renaming a Go field cannot change the protocol (inspect_json_test.go pins
// the names; version 2 is the first with them). The conversions of Key,
// Reset and RunState stop compiling when a field is added to them; a field
// added to offsetstore.Record must be added here too, or the round-trip
// test fails.

type snapshotJSON struct {
	Format     string         `json:"format"`
	Version    int            `json:"version"`
	Pid        int            `json:"pid"`
	OffsetFile string         `json:"offset_file"`
	Topics     []string       `json:"topics"`
	Started    time.Time      `json:"started"`
	TakenAt    time.Time      `json:"taken_at"`
	Stats      Stats          `json:"stats"`
	Records    []recordJSON   `json:"records"`
	Failures   []failuresJSON `json:"failures,omitempty"`
}

type keyJSON struct {
	Group     string `json:"group"`
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
}

type recordJSON struct {
	keyJSON
	Watermark    int64       `json:"watermark"`
	RecordedAt   time.Time   `json:"recorded_at"`
	Generation   int32       `json:"generation"`
	Member       string      `json:"member"`
	Committed    int64       `json:"committed"`
	CommittedAt  time.Time   `json:"committed_at"`
	LastReset    *resetJSON  `json:"last_reset,omitempty"`
	Run          *runJSON    `json:"run,omitempty"`
	Skipped      int64       `json:"skipped"`
	DeadLettered int64       `json:"dead_lettered"`
	LastCommit   *commitJSON `json:"last_commit,omitempty"`
	// Completed are the offsets completed above Watermark, [from, to).
	Completed [][2]int64 `json:"completed_ranges,omitempty"`
}

type resetJSON struct {
	At     time.Time `json:"at"`
	From   int64     `json:"from"`
	To     int64     `json:"to"`
	Reason string    `json:"reason"`
}

type runJSON struct {
	Open     bool  `json:"open"`
	Inflight int64 `json:"inflight"`
	Crashes  int32 `json:"crashes"`
}

type commitJSON struct {
	Offset     int64     `json:"offset"`
	Generation int32     `json:"generation"`
	At         time.Time `json:"at"`
	Outcome    string    `json:"outcome"` // "ok", "fenced", "error", "unknown"
	LatencyNs  int64     `json:"latency_ns"`
	Error      string    `json:"error,omitempty"`
}

type failuresJSON struct {
	keyJSON
	Failures []failureJSON `json:"failures"`
}

type failureJSON struct {
	Offset     int64     `json:"offset"`
	At         time.Time `json:"at"`
	Action     string    `json:"action"` // "skipped", "dead-lettered"
	Attempts   int32     `json:"attempts"`
	Reason     string    `json:"reason"`
	DeadLetter string    `json:"dead_letter,omitempty"`
}

// MarshalJSON encodes the snapshot in its wire format.
func (s InspectSnapshot) MarshalJSON() ([]byte, error) {
	w := snapshotJSON{Format: s.Format, Version: s.Version, Pid: s.Pid, OffsetFile: s.OffsetFile, Topics: s.Topics,
		Started: s.Started, TakenAt: s.TakenAt, Records: []recordJSON{}}
	w.Stats = s.Stats
	if w.Stats.Partitions == nil {
		w.Stats.Partitions = []PartitionStats{}
	}
	for _, e := range s.Records {
		r := recordJSON{keyJSON: keyJSON(e.Key), Watermark: e.Watermark, RecordedAt: e.RecordedAt, Generation: e.Generation,
			Member: e.Member, Committed: e.Committed, CommittedAt: e.CommittedAt, Skipped: e.Skipped, DeadLettered: e.DeadLettered}
		for _, c := range e.Completed {
			r.Completed = append(r.Completed, [2]int64{c.From, c.To})
		}
		if e.LastReset != nil {
			r.LastReset = (*resetJSON)(e.LastReset)
		}
		if e.Run != nil {
			r.Run = (*runJSON)(e.Run)
		}
		if a := e.LastCommit; a != nil {
			r.LastCommit = &commitJSON{Offset: a.Offset, Generation: a.Generation, At: a.At, Outcome: a.Outcome.String(),
				LatencyNs: int64(a.Latency), Error: a.Error}
		}
		w.Records = append(w.Records, r)
	}
	for _, fs := range s.Failures {
		f := failuresJSON{keyJSON: keyJSON(fs.Key), Failures: []failureJSON{}}
		for _, e := range fs.Failures {
			f.Failures = append(f.Failures, failureJSON{Offset: e.Offset, At: e.At, Action: e.Action.String(),
				Attempts: e.Attempts, Reason: e.Reason, DeadLetter: e.DeadLetter})
		}
		w.Failures = append(w.Failures, f)
	}
	return json.Marshal(w)
}

// UnmarshalJSON decodes the wire format.
func (s *InspectSnapshot) UnmarshalJSON(b []byte) error {
	var w snapshotJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	out := InspectSnapshot{Format: w.Format, Version: w.Version, Pid: w.Pid, OffsetFile: w.OffsetFile, Topics: w.Topics,
		Started: w.Started, TakenAt: w.TakenAt}
	out.Stats = w.Stats
	if len(out.Stats.Partitions) == 0 {
		out.Stats.Partitions = nil
	}
	for _, r := range w.Records {
		e := offsetstore.Entry{Key: offsetstore.Key(r.keyJSON), Record: offsetstore.Record{Watermark: r.Watermark,
			RecordedAt: r.RecordedAt, Generation: r.Generation, Member: r.Member, Committed: r.Committed,
			CommittedAt: r.CommittedAt, Skipped: r.Skipped, DeadLettered: r.DeadLettered}}
		for _, c := range r.Completed {
			e.Completed = append(e.Completed, offsetstore.Range{From: c[0], To: c[1]})
		}
		if r.LastReset != nil {
			e.LastReset = (*offsetstore.Reset)(r.LastReset)
		}
		if r.Run != nil {
			e.Run = (*offsetstore.RunState)(r.Run)
		}
		if a := r.LastCommit; a != nil {
			o, err := parseOutcome(a.Outcome)
			if err != nil {
				return fmt.Errorf("record %s/%d: %w", r.Topic, r.Partition, err)
			}
			e.LastCommit = &offsetstore.CommitAttempt{Offset: a.Offset, Generation: a.Generation, At: a.At, Outcome: o,
				Latency: time.Duration(a.LatencyNs), Error: a.Error}
		}
		out.Records = append(out.Records, e)
	}
	for _, fs := range w.Failures {
		f := InspectFailures{Key: offsetstore.Key(fs.keyJSON)}
		for _, e := range fs.Failures {
			a, err := parseAction(e.Action)
			if err != nil {
				return fmt.Errorf("failure %s/%d@%d: %w", fs.Topic, fs.Partition, e.Offset, err)
			}
			f.Failures = append(f.Failures, offsetstore.Failure{Offset: e.Offset, At: e.At, Action: a,
				Attempts: e.Attempts, Reason: e.Reason, DeadLetter: e.DeadLetter})
		}
		out.Failures = append(out.Failures, f)
	}
	*s = out
	return nil
}

func parseOutcome(s string) (offsetstore.CommitOutcome, error) {
	for o := offsetstore.CommitOK; o <= offsetstore.CommitUnknown; o++ {
		if o.String() == s {
			return o, nil
		}
	}
	return 0, fmt.Errorf("unknown commit outcome %q", s)
}

func parseAction(s string) (offsetstore.FailureAction, error) {
	for a := offsetstore.FailureSkipped; a <= offsetstore.FailureDeadLettered; a++ {
		if a.String() == s {
			return a, nil
		}
	}
	return 0, fmt.Errorf("unknown failure action %q", s)
}
