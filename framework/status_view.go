package framework

import (
	"fmt"
	"html/template"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

// The status page's model: a snapshot formatted for status.html, the
// partitions ranked by trouble, every value a string for people.

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
	// Protocol is the group protocol ("classic", or "consumer", where
	// Generation is the member epoch); empty in a snapshot from before
	// the field.
	Protocol      string
	Rebalances    uint64
	RebalanceTime string
	Rebalancing   bool
	Commits       CommitCounts
	Buffered      string
	FetchRequests uint64
	// Probes are shown for a Consumer's own page.
	Probes            bool
	Health, Ready     string
	HealthOK, ReadyOK bool
	CommitTrouble     string
	Partitions        []partitionRow
	Troubled          int
	Records           []recordRow
	// MissingTopics: the subscribed topics that do not exist, joined.
	MissingTopics string
	// Trend: the lag and handled rate of the last minutes, and the
	// estimate; nil before the first sample.
	Trend *trendView
}

// trendView is the page's trend section (trend.go).
type trendView struct {
	Samples               int
	Span, Every, ETASpan  string
	Lag, Rate             template.HTML
	LagNow, RateNow       string
	ETA, ETAState, ETASec string
	Handled, Produced     string
	// Followed partitions have a trend of their own; Limit of them at most.
	// Behind of them are not catching up (steady or falling behind): the
	// overall estimate counts their lag as if it would be handled.
	Followed, Limit, Owned, Behind int
}

// rowTrend is a partition's trend cell.
type rowTrend struct {
	Lag, Rate     template.HTML
	ETA, ETAState string
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
	LSO            string // at ReadCommitted, when below HWM
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
	// Trend: nil for a partition without one (not among the
	// trendPartitions with the most lag).
	Trend *rowTrend

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

func (v *statusView) fill(s *inspectSnapshot) {
	st := &s.Stats
	v.Offline = s.Pid == 0
	v.Pid, v.OffsetFile, v.TakenAt = s.Pid, s.OffsetFile, fmtWhen(s.TakenAt)
	v.Started = fmtWhen(s.Started)
	v.Topics = strings.Join(s.Topics, ", ")
	v.Group, v.Member, v.Generation = st.Group, st.Member, st.Generation
	v.Protocol = st.GroupProtocol
	v.OffsetFileErr = st.OffsetFileError
	if st.JoinError != "" {
		v.JoinTrouble = fmt.Sprintf("joining the group has failed since %s (%d attempts): %s",
			fmtWhen(st.JoinFailingSince), st.JoinFailures, st.JoinError)
	}
	v.MissingTopics = strings.Join(st.MissingTopics, ", ")
	if st.DeadLetterError != "" {
		v.DeadLetterTrouble = fmt.Sprintf("%s (since %s)", st.DeadLetterError, fmtWhen(st.DeadLetterErrorSince))
	}
	v.Rebalances, v.RebalanceTime, v.Rebalancing = st.Rebalances, fmtDur(st.RebalanceTime), st.Rebalancing
	v.Commits, v.Buffered, v.FetchRequests = st.Commits, fmtBytes(st.BufferedBytes), st.FetchRequests
	v.CommitTrouble = commitTrouble(*st)
	owned := map[offsetfile.Key]bool{}
	for _, p := range st.Partitions {
		row := partitionRowOf(p, s.TakenAt)
		if row.Trouble != "" {
			v.Troubled++
		}
		v.Partitions = append(v.Partitions, row)
		if p.State != StateRevoked {
			owned[offsetfile.Key{Group: st.Group, Topic: p.Topic, Partition: int32(p.Partition)}] = true
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

// fillTrend adds the trends of d to the page.
func (v *statusView) fillTrend(d *trendData) {
	if d == nil || v.Offline {
		return
	}
	pts := d.overall
	tv := &trendView{Samples: len(pts), Every: fmtDur(trendInterval), ETASpan: fmtSpan(trendETAWindow),
		Followed: len(d.parts), Limit: trendPartitions, Owned: int(d.owned), ETA: d.est.Text(), ETAState: d.est.State}
	if n := len(pts); n > 1 {
		tv.Span = fmtDur(time.Duration(pts[n-1].at - pts[0].at))
	} else {
		tv.Span = "0"
	}
	rates := handledRates(pts)
	tv.Lag = sparkline(lags(pts), 240, 40, "lag, last "+tv.Span+": "+seriesRange(lags(pts), fmtCountF))
	tv.Rate = sparkline(rates, 240, 40, "handled per second, last "+tv.Span+": "+seriesRange(rates, fmtRate))
	if len(pts) > 0 {
		tv.LagNow = inspect.FormatCount(pts[len(pts)-1].lag)
	}
	tv.RateNow = "-"
	if len(rates) > 0 {
		tv.RateNow = fmtRate(rates[len(rates)-1]) + "/s"
	}
	if d.est.Seconds > 0 {
		tv.ETASec = strconv.FormatInt(int64(math.Ceil(d.est.Seconds)), 10)
	}
	tv.Handled, tv.Produced = fmtRate(d.est.Handled), fmtRate(d.est.Produced)
	v.Trend = tv
	for i := range v.Partitions {
		r := &v.Partitions[i]
		p, ok := d.parts[topicPartition{r.Topic, int32(r.Partition)}]
		if !ok {
			continue
		}
		if p.est.State == etaSteady || p.est.State == etaFallingBehind {
			tv.Behind++
		}
		pl, pr := lags(p.points), handledRates(p.points)
		name := fmt.Sprintf("%s/%d ", r.Topic, r.Partition)
		r.Trend = &rowTrend{ETA: p.est.Text(), ETAState: p.est.State,
			Lag:  sparkline(pl, 96, 20, name+"lag: "+seriesRange(pl, fmtCountF)),
			Rate: sparkline(pr, 96, 20, name+"handled per second: "+seriesRange(pr, fmtRate))}
	}
}

// seriesRange describes a series for its tooltip: first, last and the
// greatest value.
func seriesRange(vals []float64, f func(float64) string) string {
	if len(vals) == 0 {
		return "no samples yet"
	}
	return fmt.Sprintf("%s to %s, at most %s", f(vals[0]), f(vals[len(vals)-1]), f(slices.Max(vals)))
}

// fmtSpan is a window's length: "minute", "5 min", else as fmtDur.
func fmtSpan(d time.Duration) string {
	switch {
	case d == time.Minute:
		return "minute"
	case d > 0 && d%time.Minute == 0:
		return fmt.Sprintf("%d min", d/time.Minute)
	}
	return fmtDur(d)
}

func fmtCountF(f float64) string { return inspect.FormatCount(int64(math.Round(f))) }

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
	if p.Restoring {
		r.Flags = append(r.Flags, fmt.Sprintf("restoring its state: %d changelog records read, %d left", p.RestoreTotal, p.RestoreRemaining))
	}
	if p.StateRebuilds > 0 {
		r.Flags = append(r.Flags, fmt.Sprintf("state rebuilt from the log start %d time(s)", p.StateRebuilds))
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
	if p.LastStable >= 0 && p.LastStable < p.HighWatermark {
		r.LSO = fmtOff(p.LastStable)
	}
	if p.TransactionWait > 0 {
		r.Flags = append(r.Flags, fmt.Sprintf("held at %d by an open transaction for %s", p.LastStable, fmtDur(p.TransactionWait)))
	}
	return r
}

// recordRowOf describes a record of the offset file; owned says a running
// consumer holds the partition now (its run is open, as it should be).
func recordRowOf(e offsetfile.Entry, owned bool) recordRow {
	r := recordRow{Group: e.Group, Topic: e.Topic, Partition: e.Partition, Watermark: fmtOff(e.Watermark),
		Committed: fmtOff(e.Committed), RecordedAt: fmtWhen(e.RecordedAt), Generation: e.Generation, Member: e.Member,
		Skipped: e.Skipped, DeadLettered: e.DeadLettered, LastCommit: "none", Run: "-"}
	if lc := e.LastCommit; lc != nil {
		r.LastCommit = fmt.Sprintf("%s: offset %d, generation %d, %s in %s", lc.Outcome, lc.Offset, lc.Generation, fmtWhen(lc.At), fmtDur(lc.Latency))
		if lc.Outcome != offsetfile.CommitOK {
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
	case e.LastCommit != nil && e.LastCommit.Outcome != offsetfile.CommitOK:
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
