package framework

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/inspect"
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
// OffsetFile+".inspect" (inspect.Endpoint as JSON, mode 0600, written
// atomically when Run starts and removed when it returns), together with
// the pid and a random token that every request must carry: only a user
// who can read the side file can read the snapshot. After a crash the
// side file stays behind; readers detect that the address no longer
// answers, and the next Run replaces it. The side file, the wire format
// and the reader are internal/inspect's: the protocol is the command's,
// not a service's.
//
// The server only reads: the durable records (offsetfile.Store.Records,
// from memory), the failure entries on request (a bbolt read transaction,
// which never blocks the writer) and Stats. It never writes the file.

// InspectDisabled, as Config.InspectSocket, serves no snapshot.
const InspectDisabled = "-"

// inspectSnapshot is the snapshot served: internal/inspect's wire format
// over this package's Stats.
type inspectSnapshot = inspect.Snapshot[Stats]

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
		where = offsetFile + inspect.SocketSuffix
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
		if where == offsetFile+inspect.SocketSuffix && c.cfg.InspectSocket == "" {
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
	ep := inspect.Endpoint{
		Version:    inspect.Version,
		Pid:        os.Getpid(),
		Network:    l.Addr().Network(),
		Address:    l.Addr().String(),
		Token:      hex.EncodeToString(tok[:]),
		OffsetFile: offsetFile,
		Started:    time.Now().UTC(),
	}
	side := offsetFile + inspect.SideFileSuffix
	if err := inspect.WriteSideFile(side, &ep); err != nil {
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

func (c *Consumer) inspectHandler(ep *inspect.Endpoint) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+inspect.Path, func(w http.ResponseWriter, r *http.Request) {
		if !inspect.Authorized(r, ep.Token) {
			http.Error(w, "missing or wrong token (see the side file)", http.StatusUnauthorized)
			return
		}
		snap, err := c.inspectSnapshot(ep, r.URL.Query().Get("failures") == "1")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		b, err := marshalSnapshot(snap)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(b, '\n'))
	})
	// The state sizes read the states' pages: a document of their own,
	// not in the snapshot the status page polls.
	mux.Handle("GET "+inspect.StatePath, inspect.StateHandler(ep.Token, c.store.StateSizes))
	return mux
}

func (c *Consumer) inspectSnapshot(ep *inspect.Endpoint, withFailures bool) (*inspectSnapshot, error) {
	snap := &inspectSnapshot{
		Format:     inspect.Format,
		Version:    inspect.SnapshotVersion,
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
			snap.Failures = append(snap.Failures, inspect.Failures{Key: e.Key, Failures: entries})
		}
	}
	return snap, nil
}

// marshalSnapshot encodes snap, its Stats' partitions as [] when there are
// none (as they always were on the wire), never null.
func marshalSnapshot(snap *inspectSnapshot) ([]byte, error) {
	if snap.Stats.Partitions == nil {
		s := *snap
		s.Stats.Partitions = []PartitionStats{}
		snap = &s
	}
	return json.Marshal(snap)
}

func init() {
	// The command serves the page a consumer serves (tidemark serve).
	inspect.SetStatusPage(statusPage)
}
