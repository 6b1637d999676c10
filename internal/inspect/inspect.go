// Package inspect is the protocol between a running consumer (package
// framework) and the tidemark command: the side file that publishes where
// the consumer serves its live snapshot, the snapshot's wire format, the
// client that fetches it, and the status page over any snapshot source,
// for `tidemark serve`.
//
// A running consumer holds its offset file's lock, so no other process may
// open the file, not even read-only: the command reads the consumer's
// snapshot instead. None of this is a service's business, which is why it
// is internal: users run the command, or mount Consumer.StatusHandler.
//
// The snapshot carries the consumer's framework.Stats, which this package
// cannot name (framework imports it): Snapshot and its functions take the
// Stats type as a type parameter, and framework registers its status page
// here (SetStatusPage) for the command to serve (StatusPage).
package inspect

import (
	"context"
	"crypto/subtle"
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
	"time"
)

// Protocol constants.
const (
	// SideFileSuffix is appended to the offset file's path to name the
	// side file that publishes the inspect address.
	SideFileSuffix = ".inspect"
	// SocketSuffix is appended to the offset file's path to name the
	// default unix socket.
	SocketSuffix = ".sock"
	// Version is the version of Endpoint (the side file).
	Version = 1
	// SnapshotVersion is the version of Snapshot. Version 2 pinned the
	// field names (snake_case) and encodes outcomes and actions as strings;
	// version 1 carried Go field names. Fields are added within a version
	// (last_stable_offset, transaction_wait_ns and aborted came with
	// IsolationLevel), never renamed or removed.
	SnapshotVersion = 2
	// Format is Snapshot.Format.
	Format = "tidemark-inspect"
	// Path is the snapshot's HTTP path; "?failures=1" adds the failure
	// entries.
	Path = "/v1/snapshot"
)

// Endpoint is the content of the side file.
type Endpoint struct {
	Version    int       `json:"version"`
	Pid        int       `json:"pid"`
	Network    string    `json:"network"` // "unix" or "tcp"
	Address    string    `json:"address"`
	Token      string    `json:"token"`
	OffsetFile string    `json:"offset_file"` // absolute
	Started    time.Time `json:"started"`
}

// WriteSideFile writes the side file atomically, mode 0600: only a user
// who can read it can read the snapshot (it holds the token).
func WriteSideFile(path string, ep *Endpoint) error {
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

// ErrNoEndpoint is returned by ReadEndpoint when the offset file has no
// side file: no consumer serves it (none runs, live inspection is off, or
// the consumer stopped cleanly).
var ErrNoEndpoint = errors.New("no inspect side file")

// maxSideFile bounds the side file a reader accepts.
const maxSideFile = 64 << 10

// ReadEndpoint reads the side file of the offset file at offsetFile. It
// returns an error wrapping ErrNoEndpoint when there is none.
func ReadEndpoint(offsetFile string) (*Endpoint, error) {
	side := offsetFile + SideFileSuffix
	fi, err := os.Lstat(side)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%s: %w", side, ErrNoEndpoint)
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
	var ep Endpoint
	if err := json.Unmarshal(b, &ep); err != nil {
		return nil, fmt.Errorf("%s: %w", side, err)
	}
	if ep.Version != Version {
		return nil, fmt.Errorf("%s: version %d, this build reads %d", side, ep.Version, Version)
	}
	if ep.Network != "unix" && ep.Network != "tcp" {
		return nil, fmt.Errorf("%s: unknown network %q", side, ep.Network)
	}
	return &ep, nil
}

// Fetch fetches the snapshot from ep; ctx bounds the whole exchange.
// withFailures adds the failure entries. S is framework.Stats.
func Fetch[S any](ctx context.Context, ep *Endpoint, withFailures bool) (*Snapshot[S], error) {
	path := Path
	if withFailures {
		path += "?failures=1"
	}
	resp, err := get(ctx, ep, path)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, statusError(ep, "", resp)
	}
	var snap Snapshot[S]
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
		return nil, fmt.Errorf("inspect endpoint %s %s: decoding the snapshot: %w", ep.Network, ep.Address, err)
	}
	if snap.Format != Format || snap.Version != SnapshotVersion {
		return nil, fmt.Errorf("inspect endpoint %s %s: format %q version %d, this build reads %s version %d",
			ep.Network, ep.Address, snap.Format, snap.Version, Format, SnapshotVersion)
	}
	return &snap, nil
}

// get sends an authorized GET of path to ep's consumer, one connection per
// call; the caller closes the body.
func get(ctx context.Context, ep *Endpoint, path string) (*http.Response, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, ep.Network, ep.Address)
		},
		DisableKeepAlives: true,
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://tidemark"+path, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+ep.Token)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return nil, fmt.Errorf("inspect endpoint %s %s: %w", ep.Network, ep.Address, err)
	}
	return resp, nil
}

// statusError is the error of a response other than 200, with the start
// of its body; what names the document asked for ("" for the snapshot).
func statusError(ep *Endpoint, what string, resp *http.Response) error {
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	return fmt.Errorf("inspect endpoint %s %s: %s%s: %s", ep.Network, ep.Address, what, resp.Status, strings.TrimSpace(string(msg)))
}

// Authorized reports whether r bears token (the side file's), as a bearer
// token; compared in constant time.
func Authorized(r *http.Request, token string) bool {
	auth := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	return subtle.ConstantTimeCompare([]byte(auth), []byte(token)) == 1
}
