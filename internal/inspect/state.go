package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// The state sizes of a running consumer's partitions (a TxHandler's
// state in the offset file) are a document of their own, at StatePath,
// beside the snapshot: they cost a read of the state's pages, which the
// snapshot (asked for every second by a status page) should not pay, and
// a consumer that does not serve them answers 404, which the command
// reports as such.

const (
	// StatePath is the HTTP path of the state sizes (StateHandler).
	StatePath = "/v1/state"
	// StateFormat and StateVersion are StateSizes' Format and Version.
	StateFormat  = "tidemark-state-sizes"
	StateVersion = 1
)

// ErrStateNotServed is returned by FetchStateSizes when the consumer does
// not serve the state sizes (a build from before them).
var ErrStateNotServed = errors.New("the consumer does not serve state sizes")

// StateSizes is the document served at StatePath.
type StateSizes struct {
	Format  string    `json:"format"` // StateFormat
	Version int       `json:"version"`
	TakenAt time.Time `json:"taken_at"`
	// Partitions are offsetfile's Store.StateSizes: every partition with
	// a state or a changelog side, sorted.
	Partitions []offsetfile.StateSize `json:"partitions"`
}

// The wire format, names pinned as the snapshot's are.
type stateSizesJSON struct {
	Format     string          `json:"format"`
	Version    int             `json:"version"`
	TakenAt    time.Time       `json:"taken_at"`
	Partitions []stateSizeJSON `json:"partitions"`
}

type stateSizeJSON struct {
	keyJSON
	Keys      int64         `json:"keys"`
	Bytes     int64         `json:"bytes"`
	Changelog *positionJSON `json:"changelog_position,omitempty"`
	Outbox    int64         `json:"outbox_entries"` // -1: no changelog side
}

// positionJSON is an offsetfile.ChangelogPosition.
type positionJSON struct {
	Epoch   int64        `json:"epoch"`
	Start   int64        `json:"start"`
	Next    int64        `json:"next"`
	Acked   int64        `json:"acked"`
	Gap     bool         `json:"gap"`
	Markers []markerJSON `json:"markers,omitempty"`
}

type markerJSON struct {
	Epoch int64 `json:"epoch"`
	Start int64 `json:"start"`
}

// MarshalJSON encodes the document in its wire format.
func (s StateSizes) MarshalJSON() ([]byte, error) {
	w := stateSizesJSON{Format: s.Format, Version: s.Version, TakenAt: s.TakenAt, Partitions: []stateSizeJSON{}}
	for _, sz := range s.Partitions {
		j := stateSizeJSON{keyJSON: keyJSON(sz.Key), Keys: sz.Keys, Bytes: sz.Bytes, Outbox: sz.Outbox}
		if p := sz.Changelog; p != nil {
			j.Changelog = &positionJSON{Epoch: p.Epoch, Start: p.Start, Next: p.Next, Acked: p.Acked, Gap: p.Gap}
			for _, m := range p.Markers {
				j.Changelog.Markers = append(j.Changelog.Markers, markerJSON(m))
			}
		}
		w.Partitions = append(w.Partitions, j)
	}
	return json.Marshal(w)
}

// UnmarshalJSON decodes the wire format.
func (s *StateSizes) UnmarshalJSON(b []byte) error {
	var w stateSizesJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	out := StateSizes{Format: w.Format, Version: w.Version, TakenAt: w.TakenAt, Partitions: []offsetfile.StateSize{}}
	for _, j := range w.Partitions {
		sz := offsetfile.StateSize{Key: offsetfile.Key(j.keyJSON), Keys: j.Keys, Bytes: j.Bytes, Outbox: j.Outbox}
		if p := j.Changelog; p != nil {
			sz.Changelog = &offsetfile.ChangelogPosition{Epoch: p.Epoch, Start: p.Start, Next: p.Next, Acked: p.Acked, Gap: p.Gap}
			for _, m := range p.Markers {
				sz.Changelog.Markers = append(sz.Changelog.Markers, offsetfile.ChangelogMarker(m))
			}
		}
		out.Partitions = append(out.Partitions, sz)
	}
	*s = out
	return nil
}

// StateHandler serves the state sizes at StatePath to a request bearing
// token (the side file's), from sizes (the consumer's
// offsetfile.Store.StateSizes). A consumer mounts it beside its snapshot:
//
//	mux.Handle("GET "+inspect.StatePath, inspect.StateHandler(ep.Token, store.StateSizes))
func StateHandler(token string, sizes func() ([]offsetfile.StateSize, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Authorized(r, token) {
			http.Error(w, "missing or wrong token (see the side file)", http.StatusUnauthorized)
			return
		}
		parts, err := sizes()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		b, err := json.Marshal(StateSizes{Format: StateFormat, Version: StateVersion, TakenAt: time.Now().UTC(), Partitions: parts})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(append(b, '\n'))
	})
}

// FetchStateSizes fetches the state sizes from ep; ctx bounds the whole
// exchange. It returns an error wrapping ErrStateNotServed when the
// consumer does not serve them.
func FetchStateSizes(ctx context.Context, ep *Endpoint) (*StateSizes, error) {
	resp, err := get(ctx, ep, StatePath)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound, http.StatusMethodNotAllowed:
		return nil, fmt.Errorf("inspect endpoint %s %s: %w", ep.Network, ep.Address, ErrStateNotServed)
	default:
		return nil, statusError(ep, "state sizes: ", resp)
	}
	var doc StateSizes
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, fmt.Errorf("inspect endpoint %s %s: decoding the state sizes: %w", ep.Network, ep.Address, err)
	}
	if doc.Format != StateFormat || doc.Version != StateVersion {
		return nil, fmt.Errorf("inspect endpoint %s %s: format %q version %d, this build reads %s version %d",
			ep.Network, ep.Address, doc.Format, doc.Version, StateFormat, StateVersion)
	}
	return &doc, nil
}
