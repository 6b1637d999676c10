package framework

import (
	"bytes"
	"context"
	_ "embed" // status.html
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/tidemark/tidemark/offsetstore"
)

// The status page and the health checks.
//
// Consumer.StatusHandler serves, read-only, over HTTP (GET and HEAD only):
//
//	/healthz      liveness: 200 "ok", or 503 and the reason (Healthy)
//	/readyz       readiness: 200 "ready", or 503 and the reason (Ready)
//	/status       one HTML page, refreshing itself every few seconds
//	/status.json  the InspectSnapshot, as the inspect socket serves it
//	              (?failures=1 adds the failure entries)
//	/metrics      Config.MetricsHandler's handler, when set (404 otherwise)
//	/             a redirect to /status
//
// StatusPage serves /status and /status.json from any snapshot source, so
// that `tidemark serve` shows the same page for a consumer it reaches
// through its inspect socket, or for a stopped consumer's file.
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

// Healthy is the liveness check: it returns nil while Run runs (or drains
// after its ctx ended), every long-lived loop it owns (the group loop, the
// fetcher, the committer) is alive, and the offset file takes writes.
// Otherwise it returns why not: Run not called or returned, a loop stuck
// in one step for longer than the configured timeouts allow (about three
// minutes with the defaults), or the offset file's last write error
// (Stats.OffsetFileError; the file's writer retries, and Healthy is nil
// again once a write succeeds).
//
// A commit outage (commits to Kafka failing) does not make the consumer
// unhealthy: the offset file keeps the watermarks, handling goes on, and a
// restart would not help. Safe to call from any goroutine, at any time.
func (c *Consumer) Healthy() error {
	err := c.live.running()
	switch {
	case errors.Is(err, errStopping):
		return nil // draining: alive, and about to return
	case err != nil:
		return err
	}
	if err := c.live.stuck(time.Now(), stuckAfter(&c.cfg)); err != nil {
		return err
	}
	if err := c.store.Err(); err != nil {
		return fmt.Errorf("the offset file takes no writes (the writer retries): %w", err)
	}
	return nil
}

// Ready is the readiness check: it returns nil while Run runs, the
// consumer is a member of a generation (Stats.Generation > 0) and every
// partition that generation assigned to it is reconciled (none in
// StateReconciling; revoked partitions do not count). Otherwise it returns
// why not: not running, stopping, joining the group (with the last join's
// error and since when, while joins fail), a dead-letter topic that takes
// no messages (not checked yet, or its writes failing), or the partitions
// still reconciling. A rebalance that only takes partitions away leaves it
// ready; one that adds partitions makes it unready until they are
// reconciled (a few round trips to Kafka).
//
// A commit outage does not make the consumer unready either (see Healthy);
// StatusHandler's /readyz says so in its body. Safe to call from any
// goroutine, at any time.
func (c *Consumer) Ready() error { return c.ready(c.Stats()) }

func (c *Consumer) ready(s Stats) error {
	if err := c.live.running(); err != nil {
		return err
	}
	if s.Generation <= 0 {
		if s.JoinError != "" {
			return fmt.Errorf("not a member of a generation: joining the group has failed since %s (%s ago, %d attempts): %s",
				s.JoinFailingSince.UTC().Format(time.RFC3339), time.Since(s.JoinFailingSince).Round(time.Second), s.JoinFailures, s.JoinError)
		}
		return errors.New("not a member of a generation: joining the group")
	}
	if s.DeadLetterError != "" {
		return fmt.Errorf("%s (since %s, %s ago)", s.DeadLetterError,
			s.DeadLetterErrorSince.UTC().Format(time.RFC3339), time.Since(s.DeadLetterErrorSince).Round(time.Second))
	}
	if c.member.status().settling {
		return fmt.Errorf("generation %d joined; reconciling its assignment", s.Generation)
	}
	var pending []string
	for _, p := range s.Partitions {
		if p.State == StateReconciling {
			pending = append(pending, fmt.Sprintf("%s/%d", p.Topic, p.Partition))
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("%d assigned partition(s) not reconciled yet: %s", len(pending), clipList(pending, 10))
	}
	return nil
}

// commitTrouble describes a commit outage in s: the owned partitions whose
// last commit failed or had no answer; "" if none.
func commitTrouble(s Stats) string {
	var bad []string
	last := ""
	for _, p := range s.Partitions {
		if p.State == StateRevoked || !commitFailing(p) {
			continue
		}
		bad = append(bad, fmt.Sprintf("%s/%d", p.Topic, p.Partition))
		if last == "" {
			last = p.CommitError
		}
		if last == "" {
			last = "last commit " + p.LastCommit
		}
	}
	if len(bad) == 0 {
		return ""
	}
	return fmt.Sprintf("commits to Kafka failing for %d partition(s) (the offset file keeps the watermarks; "+
		"the committer retries; neither probe fails for it): %s; first error: %s", len(bad), clipList(bad, 8), clipText(last, 300))
}

// clipText cuts s to n runes, marking the cut.
func clipText(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

func commitFailing(p PartitionStats) bool {
	return p.CommitError != "" || p.LastCommit == "error" || p.LastCommit == "unknown"
}

func clipList(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, "; ")
	}
	return strings.Join(s[:n], "; ") + fmt.Sprintf("; and %d more", len(s)-n)
}

// StatusHandler returns the read-only HTTP handler of the status page and
// the health checks (see the table at the top of status.go and the
// README): /healthz, /readyz, /status, /status.json, / and, when
// Config.MetricsHandler is set, /metrics. It may be mounted on any server,
// before or during Run, or served by Run itself (Config.StatusAddr); after
// Run returned, the probes answer 503.
//
// Only GET and HEAD are served (405 with an Allow header otherwise); an
// unknown path is 404, a path or query over 1 KiB 414. Nothing it serves
// changes the consumer.
func (c *Consumer) StatusHandler() http.Handler {
	s := &statusServer{snapshot: c.statusSnapshot, consumer: c}
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

// statusSnapshot is the InspectSnapshot of this consumer, as the inspect
// socket serves it.
func (c *Consumer) statusSnapshot(_ context.Context, withFailures bool) (*InspectSnapshot, error) {
	path, err := filepath.Abs(c.store.Path())
	if err != nil {
		path = c.store.Path()
	}
	ep := InspectEndpoint{Pid: os.Getpid(), OffsetFile: path}
	if at := c.live.started.Load(); at != 0 {
		ep.Started = time.Unix(0, at).UTC()
	}
	return c.inspectSnapshot(&ep, withFailures)
}

// StatusPage returns a read-only handler serving /status (the HTML page),
// /status.json (the snapshot, ?failures=1 with the failure entries) and /
// (a redirect to /status) from snapshot, called on every request with the
// request's context; a snapshot error is shown on the page, with status 503.
// Consumer.StatusHandler builds on it; `tidemark serve` serves it for a
// consumer it reaches through its inspect socket, or for its file.
//
// A snapshot with Pid 0 is the file's alone, read with no consumer running:
// it has no Stats partitions, and the page shows the file's records (run
// state, watermark, commit ledger, completed ranges, failure counts) and
// says so. The requests it refuses are StatusHandler's. snapshot must not
// be nil (every request would answer 503).
func StatusPage(snapshot func(ctx context.Context, withFailures bool) (*InspectSnapshot, error)) http.Handler {
	return &statusServer{snapshot: snapshot}
}

// statusServer serves the status paths. consumer is nil for StatusPage;
// metrics is nil unless Config.MetricsHandler is set.
type statusServer struct {
	snapshot func(ctx context.Context, withFailures bool) (*InspectSnapshot, error)
	consumer *Consumer
	metrics  http.Handler
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

func (s *statusServer) take(r *http.Request, withFailures bool) (*InspectSnapshot, error) {
	if s.snapshot == nil {
		return nil, errors.New("no snapshot source")
	}
	snap, err := s.snapshot(r.Context(), withFailures)
	if err == nil && snap == nil {
		err = errors.New("no snapshot")
	}
	return snap, err
}

func (s *statusServer) json(w http.ResponseWriter, r *http.Request) {
	snap, err := s.take(r, r.URL.Query().Get("failures") == "1")
	if err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	b, err := json.Marshal(snap)
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

// statusView is what status.html renders: every value formatted.
type statusView struct {
	Refresh int
	Now     string
	Error   string
	// Offline: the file's records only, no consumer running.
	Offline                   bool
	Pid                       int
	Started, TakenAt          string
	OffsetFile, OffsetFileErr string
	// JoinTrouble and DeadLetterTrouble: joins failing, a dead-letter
	// topic taking no messages; each with since when.
	JoinTrouble, DeadLetterTrouble string
	Group, Member, Topics          string
	Generation                     int32
	Rebalances                     uint64
	RebalanceTime                  string
	Rebalancing                    bool
	Commits                        CommitCounts
	Buffered                       string
	FetchRequests                  uint64
	// Probes are shown for a Consumer's own page.
	Probes            bool
	Health, Ready     string
	HealthOK, ReadyOK bool
	CommitTrouble     string
	Partitions        []partitionRow
	Troubled          int
	Records           []recordRow
}

type partitionRow struct {
	Topic          string
	Partition      int
	State          string
	Trouble        string // the first trouble, as in the sort; "" when none
	Flags          []string
	Processed      string
	Durable        string
	Committed      string
	HWM            string
	Lag            int64
	LagTime        string
	InFlight       int
	Waiting        int
	LastCommit     string
	CommitErr      string // the whole error, for the title; Short clipped
	CommitErrShort string
	DeadLett       uint64
	Skipped        uint64
	HandlerErr     uint64
	Retries        uint64
	Attempts       int
	Unclean        int32
	Careful        bool
	Trips          uint64
	LastError      string
	LastErrorShort string
	// LastErrorAge: how long before the snapshot LastError happened; it
	// stays once the partition recovered.
	LastErrorAge, LastErrorAt string

	rank    int
	lagTime time.Duration
}

type recordRow struct {
	Group, Topic   string
	Partition      int32
	State          string
	Watermark      string
	Committed      string
	RecordedAt     string
	Generation     int32
	Member         string
	LastCommit     string
	CommitErr      string
	CommitErrShort string
	Completed      string
	Skipped        int64
	DeadLettered   int64
	Run            string
	LastReset      string
	// Trouble: a crash loop, a failed commit, an unclean shutdown.
	Trouble bool

	rank int
}

func (v *statusView) fill(s *InspectSnapshot) {
	st := &s.Stats
	v.Offline = s.Pid == 0
	v.Pid, v.OffsetFile, v.TakenAt = s.Pid, s.OffsetFile, fmtWhen(s.TakenAt)
	v.Started = fmtWhen(s.Started)
	v.Topics = strings.Join(s.Topics, ", ")
	v.Group, v.Member, v.Generation = st.Group, st.Member, st.Generation
	v.OffsetFileErr = st.OffsetFileError
	if st.JoinError != "" {
		v.JoinTrouble = fmt.Sprintf("joining the group has failed since %s (%d attempts): %s",
			fmtWhen(st.JoinFailingSince), st.JoinFailures, st.JoinError)
	}
	if st.DeadLetterError != "" {
		v.DeadLetterTrouble = fmt.Sprintf("%s (since %s)", st.DeadLetterError, fmtWhen(st.DeadLetterErrorSince))
	}
	v.Rebalances, v.RebalanceTime, v.Rebalancing = st.Rebalances, fmtDur(st.RebalanceTime), st.Rebalancing
	v.Commits, v.Buffered, v.FetchRequests = st.Commits, fmtBytes(st.BufferedBytes), st.FetchRequests
	v.CommitTrouble = commitTrouble(*st)
	owned := map[offsetstore.Key]bool{}
	for _, p := range st.Partitions {
		row := partitionRowOf(p, s.TakenAt)
		if row.Trouble != "" {
			v.Troubled++
		}
		v.Partitions = append(v.Partitions, row)
		if p.State != StateRevoked {
			owned[offsetstore.Key{Group: st.Group, Topic: p.Topic, Partition: int32(p.Partition)}] = true
		}
	}
	slices.SortStableFunc(v.Partitions, func(a, b partitionRow) int {
		switch {
		case a.rank != b.rank:
			return a.rank - b.rank
		case a.lagTime != b.lagTime:
			return -cmpDur(a.lagTime, b.lagTime)
		case a.Lag != b.Lag:
			return -int(max(min(a.Lag-b.Lag, 1), -1))
		case a.Topic != b.Topic:
			return strings.Compare(a.Topic, b.Topic)
		}
		return a.Partition - b.Partition
	})
	for _, e := range s.Records {
		v.Records = append(v.Records, recordRowOf(e, owned[e.Key]))
	}
	slices.SortStableFunc(v.Records, func(a, b recordRow) int { return a.rank - b.rank })
}

func cmpDur(a, b time.Duration) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// troubleOf ranks a partition for the page: the troubles first, in this
// order, then the healthy ones, then the revoked ones.
func troubleOf(p PartitionStats) (rank int, trouble string) {
	switch {
	case p.State == StateStalled:
		return 0, "stalled"
	case p.State == StateStopped:
		return 1, "stopped"
	case p.State == StatePaused || p.Paused:
		return 2, "paused"
	case p.State == StateRetrying:
		return 3, "retrying"
	case p.State == StateDeadLettering:
		return 4, "dead-lettering"
	case p.State == StateRevoked:
		return 10, ""
	case commitFailing(p):
		return 5, "commit-error"
	case p.WindowFull:
		return 6, "window-full"
	case p.DurableWait:
		return 7, "durable-wait"
	case p.Careful:
		return 8, "careful"
	}
	return 9, ""
}

// partitionRowOf formats p, taken at now, for the page.
func partitionRowOf(p PartitionStats, now time.Time) partitionRow {
	r := partitionRow{Topic: p.Topic, Partition: p.Partition, State: string(p.State),
		Processed: fmtOff(p.Processed), Durable: fmtOff(p.Durable), Committed: fmtOff(p.Committed), HWM: fmtOff(p.HighWatermark),
		Lag: p.Lag, LagTime: fmtDur(p.LagTime), InFlight: p.InFlight, Waiting: p.Waiting,
		LastCommit: p.LastCommit, CommitErr: p.CommitError, DeadLett: p.DeadLettered, Skipped: p.Skipped,
		HandlerErr: p.HandlerErrors, Retries: p.Retries, Attempts: p.Attempts, Unclean: p.UncleanRestarts,
		Careful: p.Careful, Trips: p.BreakerTrips, LastError: p.LastError, lagTime: p.LagTime,
		CommitErrShort: clipText(p.CommitError, 90), LastErrorShort: clipText(p.LastError, 200)}
	if r.LastCommit == "" {
		r.LastCommit = "none yet"
	}
	if p.LastError != "" && !p.LastErrorAt.IsZero() {
		r.LastErrorAge = fmtDur(now.Sub(p.LastErrorAt)) + " ago"
		r.LastErrorAt = fmtWhen(p.LastErrorAt)
	}
	if p.Lag == 0 {
		r.LagTime = "0"
	}
	r.rank, r.Trouble = troubleOf(p)
	if p.Paused && p.State != StatePaused {
		r.Flags = append(r.Flags, "paused")
	}
	if p.WindowFull {
		r.Flags = append(r.Flags, "window full")
	}
	if p.DurableWait {
		r.Flags = append(r.Flags, "waiting for the offset file")
	}
	if p.Careful {
		r.Flags = append(r.Flags, "careful")
	}
	if p.Attempts > 0 {
		r.Flags = append(r.Flags, fmt.Sprintf("attempt %d", p.Attempts))
	}
	if p.OldestIncomplete >= 0 && p.OldestAge >= time.Second {
		r.Flags = append(r.Flags, fmt.Sprintf("offset %d incomplete for %s", p.OldestIncomplete, fmtDur(p.OldestAge)))
	}
	if p.CompletedAhead > 0 {
		r.Flags = append(r.Flags, fmt.Sprintf("%d completed ahead", p.CompletedAhead))
	}
	return r
}

// recordRowOf describes a record of the offset file; owned says a running
// consumer holds the partition now (its run is open, as it should be).
func recordRowOf(e offsetstore.Entry, owned bool) recordRow {
	r := recordRow{Group: e.Group, Topic: e.Topic, Partition: e.Partition, Watermark: fmtOff(e.Watermark),
		Committed: fmtOff(e.Committed), RecordedAt: fmtWhen(e.RecordedAt), Generation: e.Generation, Member: e.Member,
		Skipped: e.Skipped, DeadLettered: e.DeadLettered, LastCommit: "none", Run: "-"}
	if lc := e.LastCommit; lc != nil {
		r.LastCommit = fmt.Sprintf("%s: offset %d, generation %d, %s in %s", lc.Outcome, lc.Offset, lc.Generation, fmtWhen(lc.At), fmtDur(lc.Latency))
		if lc.Outcome != offsetstore.CommitOK {
			r.CommitErr, r.CommitErrShort = lc.Error, clipText(lc.Error, 90)
		}
	}
	if run := e.Run; run != nil {
		switch {
		case run.Open && owned:
			r.Run = "held by the running consumer"
		case run.Open:
			r.Run = "open: not released (crash, kill, power loss)"
		default:
			r.Run = "released cleanly"
		}
		if run.Crashes > 0 {
			r.Run += fmt.Sprintf("; %d unclean ends in a row at offset %d", run.Crashes, run.Inflight)
		}
	}
	if n := len(e.Completed); n > 0 {
		var total int64
		for _, c := range e.Completed {
			total += c.To - c.From
		}
		parts := make([]string, 0, min(n, 3))
		for _, c := range e.Completed[:min(n, 3)] {
			parts = append(parts, fmt.Sprintf("[%d, %d)", c.From, c.To))
		}
		r.Completed = fmt.Sprintf("%d offsets in %d ranges: %s", total, n, strings.Join(parts, " "))
		if n > 3 {
			r.Completed += " ..."
		}
	}
	if rs := e.LastReset; rs != nil {
		r.LastReset = fmt.Sprintf("%s: %s -> %d: %s", fmtWhen(rs.At), fmtOff(rs.From), rs.To, rs.Reason)
	}
	switch {
	case e.Run != nil && e.Run.Crashes > 0:
		r.rank, r.State = 0, "crash-loop"
	case e.LastCommit != nil && e.LastCommit.Outcome != offsetstore.CommitOK:
		r.rank, r.State = 1, "commit-"+e.LastCommit.Outcome.String()
	case e.Run != nil && e.Run.Open && !owned:
		r.rank, r.State = 2, "unclean-shutdown"
	case e.Watermark >= 0 && e.Watermark > e.Committed:
		r.rank, r.State = 3, "pending-commit"
	default:
		r.rank, r.State = 4, "clean"
	}
	r.Trouble = r.rank <= 2
	return r
}

func fmtOff(o int64) string {
	if o < 0 {
		return "-"
	}
	return strconv.FormatInt(o, 10)
}

func fmtWhen(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// fmtDur is a duration for people: 850ms, 4.2s, 3m12s, 5h3m.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "0"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

func fmtBytes(n int64) string {
	switch {
	case n < 1<<10:
		return fmt.Sprintf("%d B", n)
	case n < 1<<20:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// Serving StatusHandler from Run (Config.StatusAddr).

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

// serveStatus starts the status server when Config.StatusAddr is set. stop
// shuts it down and waits for its goroutine; Run calls it before the offset
// file closes. A failure to listen is returned: Run returns it.
func (c *Consumer) serveStatus() (stop func(), err error) {
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
		ErrorLog:          zap.NewStdLog(log.WithOptions(zap.IncreaseLevel(zap.WarnLevel))),
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
