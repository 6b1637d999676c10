package framework

import (
	"bytes"
	"context"
	_ "embed" // status.html
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	stdlog "log"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tidemark/tidemark/internal/inspect"
)

// The status page and the health checks.
//
// Consumer.StatusHandler serves, read-only, over HTTP (GET and HEAD only):
//
//	/healthz      liveness: 200 "ok", or 503 and the reason (Healthy)
//	/readyz       readiness: 200 "ready", or 503 and the reason (Ready)
//	/status       one HTML page, refreshing itself every few seconds, with
//	              the lag and handled rate of the last ten minutes as
//	              sparklines and when the lag will be gone (trend.go)
//	/status.json  the snapshot, as the inspect socket serves it
//	              (?failures=1 adds the failure entries), and "trend", the
//	              page's series and estimates
//	/metrics      Config.MetricsHandler's handler, when set (404 otherwise)
//	/             a redirect to /status
//
// statusPage serves /status and /status.json from any snapshot source, so
// that `tidemark serve` shows the same page for a consumer it reaches
// through its inspect socket, or for a stopped consumer's file; the
// command reaches it through internal/inspect (inspect.StatusPage).
//
// Config.StatusAddr makes Run serve StatusHandler itself.

// Status server limits: a request's query and path are each refused past
// maxStatusURL bytes (414), its header past maxStatusHeader.
const (
	maxStatusURL    = 1 << 10
	maxStatusHeader = 8 << 10
	// statusRefresh is how often the page reloads itself, in seconds.
	statusRefresh = 5
)

// StatusHandler returns the read-only HTTP handler of the status page and
// the health checks (docs/operations.md and the README describe each):
// /healthz, /readyz, /status, /status.json, / and, when
// Config.MetricsHandler is set, /metrics. It may be mounted on any server,
// before or during Run, or served by Run itself (Config.StatusAddr); after
// Run returned, the probes answer 503.
//
// Only GET and HEAD are served (405 with an Allow header otherwise); an
// unknown path is 404, a path or query over 1 KiB 414. Nothing it serves
// changes the consumer.
//
// Once StatusHandler has been called (or Config.StatusAddr is set), Run
// samples Stats every 5 s for the page's trends, on a goroutine that ends
// before Run returns: ten minutes of lag and handled rate, overall and for
// the 100 partitions with the most lag, about 2 KiB each.
func (c *Consumer) StatusHandler() http.Handler {
	c.trend.wanted.Store(true) // Run samples for the page from now on
	s := &statusServer{snapshot: c.statusSnapshot, consumer: c, trend: &c.trend}
	if c.cfg.MetricsHandler != nil {
		s.metrics = c.metrics()
	}
	return s
}

// metrics returns Config.MetricsHandler's handler, made once.
func (c *Consumer) metrics() http.Handler {
	c.metricsOnce.Do(func() { c.metricsHandler = c.cfg.MetricsHandler(c) })
	return c.metricsHandler
}

// statusSnapshot is the snapshot of this consumer, as the inspect socket
// serves it.
func (c *Consumer) statusSnapshot(_ context.Context, withFailures bool) (*inspectSnapshot, error) {
	path, err := filepath.Abs(c.store.Path())
	if err != nil {
		path = c.store.Path()
	}
	ep := inspect.Endpoint{Pid: os.Getpid(), OffsetFile: path}
	if at := c.live.started.Load(); at != 0 {
		ep.Started = time.Unix(0, at).UTC()
	}
	return c.inspectSnapshot(&ep, withFailures)
}

// statusPage returns a read-only handler serving /status (the HTML page),
// /status.json (the snapshot, ?failures=1 with the failure entries) and /
// (a redirect to /status) from snapshot, called on every request with the
// request's context; a snapshot error is shown on the page, with status 503.
// Consumer.StatusHandler builds on it; `tidemark serve` serves it for a
// consumer it reaches through its inspect socket, or for its file.
//
// It keeps the page's trends from the snapshots it serves: each one at
// least 4 s after the last sampled is sampled, and a snapshot of another
// process (Pid, Started) starts them afresh.
//
// A snapshot with Pid 0 is the file's alone, read with no consumer running:
// it has no Stats partitions, and the page shows the file's records (run
// state, watermark, commit ledger, completed ranges, failure counts) and
// says so. The requests it refuses are StatusHandler's. A nil snapshot
// answers 503 to every request.
func statusPage(snapshot inspect.Source[Stats]) http.Handler {
	return &statusServer{snapshot: snapshot, trend: &trend{}, sampleServed: true}
}

// statusServer serves the status paths. consumer is nil for statusPage;
// metrics is nil unless Config.MetricsHandler is set. trend is the
// Consumer's, sampled by Run, or statusPage's own, sampled from the
// snapshots served (sampleServed).
type statusServer struct {
	snapshot     inspect.Source[Stats]
	consumer     *Consumer
	metrics      http.Handler
	trend        *trend
	sampleServed bool
}

func (s *statusServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if len(r.URL.RawQuery) > maxStatusURL || len(r.URL.Path) > maxStatusURL || len(r.URL.RawPath) > maxStatusURL {
		http.Error(w, "request URI too long: path and query are limited to 1 KiB each", http.StatusRequestURITooLong)
		return
	}
	var h http.HandlerFunc
	switch r.URL.Path {
	case "/":
		// Relative, like the page's links: the handler works under a prefix
		// (http.StripPrefix) too.
		h = func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Location", "status")
			w.WriteHeader(http.StatusFound)
		}
	case "/status":
		h = s.page
	case "/status.json":
		h = s.json
	case "/healthz":
		if s.consumer != nil {
			h = s.healthz
		}
	case "/readyz":
		if s.consumer != nil {
			h = s.readyz
		}
	case "/metrics":
		if s.metrics != nil {
			h = s.metrics.ServeHTTP
		}
	}
	if h == nil {
		http.Error(w, "404 page not found: "+s.paths(), http.StatusNotFound)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method "+r.Method+" not allowed: this server is read-only (GET, HEAD)", http.StatusMethodNotAllowed)
		return
	}
	if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
		http.Error(w, "bad query: "+err.Error(), http.StatusBadRequest)
		return
	}
	hd := w.Header()
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Content-Type-Options", "nosniff")
	h(w, r)
}

func (s *statusServer) paths() string {
	p := "/status, /status.json"
	if s.consumer != nil {
		p += ", /healthz, /readyz"
	}
	if s.metrics != nil {
		p += ", /metrics"
	}
	return "this server serves " + p
}

func (s *statusServer) healthz(w http.ResponseWriter, _ *http.Request) {
	c := s.consumer
	if err := c.Healthy(); err != nil {
		probeText(w, http.StatusServiceUnavailable, "unhealthy: "+err.Error())
		return
	}
	text := "ok"
	if errors.Is(c.live.running(), errStopping) {
		text += "\n" + errStopping.Error()
	}
	if t := commitTrouble(c.Stats()); t != "" {
		text += "\n" + t
	}
	probeText(w, http.StatusOK, text)
}

func (s *statusServer) readyz(w http.ResponseWriter, _ *http.Request) {
	c := s.consumer
	st := c.Stats()
	if err := c.ready(st); err != nil {
		probeText(w, http.StatusServiceUnavailable, "not ready: "+err.Error())
		return
	}
	text := "ready"
	if t := commitTrouble(st); t != "" {
		text += "\n" + t
	}
	probeText(w, http.StatusOK, text)
}

func probeText(w http.ResponseWriter, code int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, text)
}

func (s *statusServer) take(r *http.Request, withFailures bool) (*inspectSnapshot, error) {
	if s.snapshot == nil {
		return nil, errors.New("no snapshot source")
	}
	snap, err := s.snapshot(r.Context(), withFailures)
	if err == nil && snap == nil {
		err = errors.New("no snapshot")
	}
	if err == nil && s.sampleServed && snap.Pid != 0 {
		s.trend.from(fmt.Sprintf("%d %d", snap.Pid, snap.Started.UnixNano()))
		s.trend.add(snap.TakenAt, &snap.Stats)
	}
	return snap, err
}

// trendData is the trends to show with snap; nil for a file's snapshot.
func (s *statusServer) trendData(snap *inspectSnapshot) *trendData {
	if s.trend == nil || snap.Pid == 0 {
		return nil
	}
	return s.trend.data()
}

func (s *statusServer) json(w http.ResponseWriter, r *http.Request) {
	snap, err := s.take(r, r.URL.Query().Get("failures") == "1")
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	b, err := marshalSnapshot(snap)
	if d := s.trendData(snap); err == nil && d != nil {
		// "trend" beside the snapshot's own fields: the snapshot encodes
		// itself (MarshalJSON), so the member is spliced in before its
		// closing brace.
		var tb []byte
		if tb, err = json.Marshal(d.json()); err == nil && len(b) > 2 && b[len(b)-1] == '}' {
			b = append(append(append(b[:len(b)-1:len(b)-1], `,"trend":`...), tb...), '}')
		}
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

// statusTemplate is status.html, parsed once.
var statusTemplate = sync.OnceValues(func() (*template.Template, error) {
	return template.New("status.html").Parse(statusHTML)
})

//go:embed status.html
var statusHTML string

func (s *statusServer) page(w http.ResponseWriter, r *http.Request) {
	code := http.StatusOK
	snap, err := s.take(r, false)
	v := statusView{Refresh: statusRefresh, Now: fmtWhen(time.Now())}
	if err != nil {
		code, v.Error = http.StatusServiceUnavailable, err.Error()
	} else {
		v.fill(snap)
		v.fillTrend(s.trendData(snap))
		if c := s.consumer; c != nil {
			v.Probes = true
			if err := c.Healthy(); err != nil {
				v.Health = "unhealthy: " + err.Error()
			} else {
				v.Health, v.HealthOK = "ok", true
			}
			if err := c.ready(snap.Stats); err != nil {
				v.Ready = "not ready: " + err.Error()
			} else {
				v.Ready, v.ReadyOK = "ready", true
			}
		}
	}
	t, terr := statusTemplate()
	var b bytes.Buffer
	if terr == nil {
		terr = t.Execute(&b, &v)
	}
	if terr != nil {
		http.Error(w, "rendering the status page: "+terr.Error(), http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	// No script, no external asset: inline style only.
	hd.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	hd.Set("Referrer-Policy", "no-referrer")
	w.WriteHeader(code)
	_, _ = w.Write(b.Bytes())
}

// statusListenAddr is where Config.StatusAddr listens: a host-less
// ":PORT" listens on 127.0.0.1:PORT.
func statusListenAddr(s string) (string, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", fmt.Errorf("%q is not a host:port address: %v", s, err)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || port == "" {
		return "", fmt.Errorf("%q: the port must be a number from 0 to 65535", s)
	} else if n == 0 && port != "0" {
		return "", fmt.Errorf("%q: the port must be a number from 0 to 65535", s)
	}
	if host == "" {
		host = "127.0.0.1" // loopback unless told otherwise
	}
	return net.JoinHostPort(host, port), nil
}

// serveStatus starts the status server when Config.StatusAddr is set, and
// the goroutine sampling the page's trends. stop shuts the server down and
// ends the sampler, waiting for both goroutines; Run calls it before the
// offset file closes. A failure to listen is returned: Run returns it.
func (c *Consumer) serveStatus() (stop func(), err error) {
	stopServer, err := c.serveStatusAddr()
	if err != nil {
		return nil, err
	}
	stopSampling := c.sampleTrend()
	return func() {
		stopServer()
		stopSampling()
	}, nil
}

// sampleTrend samples Stats for the status page's trends every
// trendInterval, from now until stop, once a status handler exists
// (StatusHandler sets trend.wanted; Config.StatusAddr makes one): until
// then each tick only reads a flag. stop ends the goroutine and waits for
// it.
func (c *Consumer) sampleTrend() (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(trendInterval)
		defer tick.Stop()
		for {
			if c.trend.wanted.Load() {
				st := c.Stats()
				c.trend.add(time.Now(), &st)
			}
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			<-done
		})
	}
}

// serveStatusAddr serves StatusHandler on Config.StatusAddr, when set.
func (c *Consumer) serveStatusAddr() (stop func(), err error) {
	if c.cfg.StatusAddr == "" {
		return func() {}, nil
	}
	addr, err := statusListenAddr(c.cfg.StatusAddr)
	if err != nil {
		return nil, err // withDefaults refused it already
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tidemark: serving the status page (Config.StatusAddr %q): %w", c.cfg.StatusAddr, err)
	}
	log := c.log.Named("status")
	srv := &http.Server{
		Handler:           c.StatusHandler(),
		ReadHeaderTimeout: 2 * time.Second,
		ReadTimeout:       5 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       time.Minute,
		MaxHeaderBytes:    maxStatusHeader,
		ErrorLog:          serverErrorLog(log),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l) // returns ErrServerClosed after Shutdown
	}()
	log.Info("serving the status page and health checks", zap.String("address", l.Addr().String()),
		zap.String("url", "http://"+l.Addr().String()+"/status"))
	var once sync.Once
	return func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			if srv.Shutdown(ctx) != nil {
				_ = srv.Close()
			}
			cancel()
			<-done
		})
	}, nil
}

// serverErrorLog is an http.Server's ErrorLog writing to log at warn level.
// (zap.IncreaseLevel on a logger whose level is above warn made zap print
// an error of its own to stderr, and dropped the server's info lines.)
func serverErrorLog(log *zap.Logger) *stdlog.Logger {
	l, err := zap.NewStdLogAt(log, zap.WarnLevel)
	if err != nil { // only for a level zap does not know
		return zap.NewStdLog(log)
	}
	return l
}
