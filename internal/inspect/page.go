package inspect

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
)

// Source gives the snapshot a status page shows, called on every request
// with the request's context.
type Source[S any] func(ctx context.Context, withFailures bool) (*Snapshot[S], error)

// page is framework's status page constructor, a func(Source[S])
// http.Handler for framework's Stats, set by framework's init. (Not an
// atomic.Value, which panics on a second Store of another type.)
var page struct {
	sync.Mutex
	f any
}

// SetStatusPage registers the status page over any snapshot source;
// framework calls it from init, so that the command serves the page a
// consumer serves without framework exporting it.
func SetStatusPage[S any](f func(Source[S]) http.Handler) {
	page.Lock()
	defer page.Unlock()
	page.f = f
}

// StatusPage returns the registered status page over src: /status,
// /status.json and /. An error means no page is registered for this Stats
// type (a program that does not import framework).
func StatusPage[S any](src Source[S]) (http.Handler, error) {
	if src == nil {
		return nil, errors.New("inspect: StatusPage with a nil snapshot source")
	}
	page.Lock()
	f, ok := page.f.(func(Source[S]) http.Handler)
	page.Unlock()
	if !ok {
		var s S
		return nil, fmt.Errorf("inspect: no status page registered for snapshots of %T (framework registers it)", s)
	}
	return f(src), nil
}

// FormatCount is n with thousands separated (1,234,567), as the status page
// and the command's tables show counts.
func FormatCount(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
