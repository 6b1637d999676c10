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
	// as strings; version 1 carried Go field names. Fields are added
	// within a version (last_stable_offset, transaction_wait_ns and
	// aborted came with IsolationLevel), never renamed or removed.
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
		ErrorLog:          serverErrorLog(log),
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
