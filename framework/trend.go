package framework

import (
	"cmp"
	"fmt"
	"html/template"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidemark/tidemark/internal/inspect"
)

// The status page's trends: the lag and the handled count of the last ten
// minutes, overall and per partition, and the estimate of when the
// consumer catches up.
//
// A Consumer samples its Stats every trendInterval while Run runs, on one
// goroutine that serveStatus starts and Run's stop of the status server
// awaits; it takes samples only once a status handler exists
// (StatusHandler, Config.StatusAddr), so a consumer nobody watches pays one
// timer wake every 5 s. Sampling when the page is served instead would
// leave the page without a history when an operator first opens it, which
// is when it is asked "is the lag shrinking?". statusPage has no Run to
// sample from: it samples each snapshot it serves (the page reloads every
// 5 s while it is watched), and starts afresh when the snapshot's process
// changes.
//
// Memory is bounded: the overall ring holds trendSamples samples of 40
// bytes; per-partition rings (trendSamples samples of 16 bytes, about
// 2 KiB each with the map entry) are kept for the trendPartitions owned
// partitions with the most lag, at most about 200 KiB whatever the
// partition count; the selection keeps 16 bytes of scratch per partition
// (160 KiB at 10,000) and sorts it once a sample when more than
// trendPartitions are owned. A partition that leaves the top loses its history;
// on a tie in lag the partitions already followed stay.

const (
	// trendInterval is how often a Consumer samples its Stats;
	// trendSamples how many samples a ring keeps: ten minutes.
	trendInterval = 5 * time.Second
	trendSamples  = 120
	// trendETAWindow is how far back the estimate looks: the rates of the
	// last minute, so that a burst produced five minutes ago no longer
	// says "falling behind" once the consumer is draining it.
	trendETAWindow = time.Minute
	// trendMinPoints is how many samples the estimate needs in its window
	// (two intervals); with fewer it says "measuring".
	trendMinPoints = 3
	// trendPartitions is how many partitions keep a trend of their own.
	trendPartitions = 100
)

// ring keeps the last len(buf) values pushed.
type ring[T any] struct {
	buf  []T
	next int // where the next push goes
	n    int
}

func newRing[T any](size int) *ring[T] { return &ring[T]{buf: make([]T, max(size, 1))} }

func (r *ring[T]) push(v T) {
	r.buf[r.next] = v
	r.next = (r.next + 1) % len(r.buf)
	r.n = min(r.n+1, len(r.buf))
}

func (r *ring[T]) len() int { return r.n }

// at returns the i-th value kept, 0 the oldest.
func (r *ring[T]) at(i int) T { return r.buf[(r.next-r.n+i+len(r.buf))%len(r.buf)] }

// values returns what the ring keeps, oldest first, in a new slice.
func (r *ring[T]) values() []T {
	out := make([]T, r.n)
	for i := range out {
		out[i] = r.at(i)
	}
	return out
}

// trendPoint is one sample of a partition or of the whole consumer: when,
// the lag then, and the messages handled so far (PartitionStats.Handled,
// which only grows while the consumer runs).
type trendPoint struct {
	at      int64 // Unix nanoseconds
	lag     int64
	handled uint64
}

// totalSample is a sample of the whole consumer. rebalances and owned mark
// the assignment it was taken in: the lag jumps when partitions come or go,
// so the estimate only looks at the samples of the current one.
type totalSample struct {
	trendPoint
	rebalances uint64
	owned      int32
}

func (s totalSample) sameAssignment(o totalSample) bool {
	return s.rebalances == o.rebalances && s.owned == o.owned
}

// partSample is a sample of one partition; its time is the overall ring's
// sample pushed with it (a partition's ring ends where the overall one
// does).
type partSample struct {
	lag     int64
	handled uint64
}

type partTrend struct {
	samples *ring[partSample]
	seen    uint64 // the sample that last selected it
}

// trend holds the rings. Its zero value is ready: Consumer embeds one.
// wanted is set once a status handler exists.
type trend struct {
	wanted atomic.Bool

	mu     sync.Mutex
	totals *ring[totalSample]
	parts  map[topicPartition]*partTrend
	seq    uint64
	source string // the process sampled, for statusPage: (pid, start)
	pick   []trendPick
}

// trendPick is a candidate for a trend of its own: a partition of the
// Stats sampled, by index.
type trendPick struct {
	lag      int64
	i        int32
	followed bool
}

// add samples st, taken at at. A sample closer than 4/5 of trendInterval
// to the last one is dropped, so that several viewers of a statusPage do
// not shorten its history; so is one older than the last.
func (t *trend) add(at time.Time, st *Stats) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := at.UnixNano()
	if t.totals == nil {
		t.totals = newRing[totalSample](trendSamples)
		t.parts = map[topicPartition]*partTrend{}
	}
	if n := t.totals.len(); n > 0 && now-t.totals.at(n-1).at < int64(trendInterval*4/5) {
		return false
	}
	s := totalSample{trendPoint: trendPoint{at: now}, rebalances: st.Rebalances}
	t.pick = t.pick[:0]
	for i := range st.Partitions {
		p := &st.Partitions[i]
		s.handled += p.Handled
		if p.State == StateRevoked {
			continue
		}
		s.owned++
		s.lag += max(p.Lag, 0)
		t.pick = append(t.pick, trendPick{lag: p.Lag, i: int32(i)})
	}
	t.totals.push(s)
	t.seq++
	if len(t.pick) > trendPartitions {
		for k := range t.pick {
			p := &st.Partitions[t.pick[k].i]
			_, t.pick[k].followed = t.parts[topicPartition{p.Topic, int32(p.Partition)}]
		}
		// The most lag first; on a tie, the partitions followed already,
		// then Stats' order (topic, partition).
		slices.SortFunc(t.pick, func(a, b trendPick) int {
			if c := cmp.Compare(b.lag, a.lag); c != 0 {
				return c
			}
			if a.followed != b.followed {
				if a.followed {
					return -1
				}
				return 1
			}
			return cmp.Compare(a.i, b.i)
		})
		t.pick = t.pick[:trendPartitions]
	}
	for _, k := range t.pick {
		p := &st.Partitions[k.i]
		tp := topicPartition{p.Topic, int32(p.Partition)}
		pt := t.parts[tp]
		if pt == nil {
			pt = &partTrend{samples: newRing[partSample](trendSamples)}
			t.parts[tp] = pt
		}
		pt.samples.push(partSample{lag: max(p.Lag, 0), handled: p.Handled})
		pt.seen = t.seq
	}
	for tp, pt := range t.parts {
		if pt.seen != t.seq {
			delete(t.parts, tp) // revoked, or no longer among the most lagging
		}
	}
	return true
}

// from starts the trend afresh when the snapshots come from another
// process than the last ones (statusPage: the consumer restarted).
func (t *trend) from(source string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.source != source {
		t.source, t.totals, t.parts = source, nil, nil
	}
}

// trendData is a copy of the rings, with their estimates.
type trendData struct {
	overall []trendPoint
	owned   int32
	est     trendEstimate
	parts   map[topicPartition]partTrendData
}

type partTrendData struct {
	points []trendPoint
	est    trendEstimate
}

// data copies the rings out; nil before the first sample.
func (t *trend) data() *trendData {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.totals == nil || t.totals.len() == 0 {
		return nil
	}
	all := t.totals.values()
	d := &trendData{overall: make([]trendPoint, len(all)), parts: make(map[topicPartition]partTrendData, len(t.parts))}
	first := len(all) - 1 // the first sample of the current assignment
	for first > 0 && all[first-1].sameAssignment(all[len(all)-1]) {
		first--
	}
	for i, s := range all {
		d.overall[i] = s.trendPoint
	}
	last := all[len(all)-1]
	d.owned = last.owned
	if last.owned == 0 {
		d.est = trendEstimate{State: etaUnassigned}
	} else {
		d.est = estimateTrend(lastWindow(d.overall[first:], trendETAWindow))
	}
	for tp, pt := range t.parts {
		ps := pt.samples.values()
		pts := make([]trendPoint, len(ps))
		for i, s := range ps {
			pts[i] = trendPoint{at: all[len(all)-len(ps)+i].at, lag: s.lag, handled: s.handled}
		}
		d.parts[tp] = partTrendData{points: pts, est: estimateTrend(lastWindow(pts, trendETAWindow))}
	}
	return d
}

// lastWindow returns the points of the last span: those taken at most span
// before the last one.
func lastWindow(pts []trendPoint, span time.Duration) []trendPoint {
	if len(pts) == 0 {
		return nil
	}
	end := pts[len(pts)-1].at
	i := len(pts) - 1
	for i > 0 && end-pts[i-1].at <= int64(span) {
		i--
	}
	return pts[i:]
}

// The estimate's states.
const (
	etaCaughtUp      = "caught-up"      // no lag
	etaCatchingUp    = "catching-up"    // the lag shrinks: Seconds says when it is gone
	etaKeepingUp     = "keeping-up"     // a lag under a second of handling
	etaFallingBehind = "falling-behind" // the lag grows
	etaSteady        = "steady"         // the lag does not move
	etaMeasuring     = "measuring"      // too few samples yet
	etaUnassigned    = "unassigned"     // no partition owned
)

// trendEstimate says when the lag is gone, from the rates over a window:
// Handled and Produced are messages per second; Seconds is lag / (Handled
// - Produced), set when catching up.
type trendEstimate struct {
	State              string
	Seconds            float64
	Handled, Produced  float64
	Lag, Growth        int64 // the lag now; its change over the window
	Points, PointsNeed int
}

// estimateTrend estimates from pts, oldest first: the handled rate is the
// growth of the handled count over the window, the produced rate that plus
// the lag's growth (what was produced is handled or still lagging), and
// the lag is gone in lag / (handled - produced) seconds when that is
// positive.
func estimateTrend(pts []trendPoint) trendEstimate {
	e := trendEstimate{State: etaMeasuring, Points: len(pts), PointsNeed: trendMinPoints}
	if len(pts) == 0 {
		return e
	}
	first, last := pts[0], pts[len(pts)-1]
	e.Lag = last.lag
	if last.lag <= 0 {
		e.State = etaCaughtUp
	}
	dt := float64(last.at-first.at) / float64(time.Second)
	if len(pts) < trendMinPoints || dt <= 0 {
		return e
	}
	e.Growth = last.lag - first.lag
	if last.handled >= first.handled {
		e.Handled = float64(last.handled-first.handled) / dt
	}
	e.Produced = max(e.Handled+float64(e.Growth)/dt, 0) // negative: records deleted, or a reset
	if e.State == etaCaughtUp {
		return e
	}
	net := e.Handled - e.Produced
	switch {
	case e.Handled > 0 && float64(last.lag) <= e.Handled:
		e.State = etaKeepingUp
	case e.Growth < 0 && net > 0:
		e.State, e.Seconds = etaCatchingUp, float64(last.lag)/net
	case e.Growth > 0:
		e.State = etaFallingBehind
	default:
		e.State = etaSteady
	}
	return e
}

// Text is the estimate for people.
func (e trendEstimate) Text() string {
	switch e.State {
	case etaCaughtUp:
		return "caught up"
	case etaCatchingUp:
		return "caught up in " + fmtETA(e.Seconds)
	case etaKeepingUp:
		return "keeping up (lag under 1 s of handling)"
	case etaFallingBehind:
		return fmt.Sprintf("falling behind (lag +%s/s)", fmtRate(e.Produced-e.Handled))
	case etaSteady:
		if e.Handled == 0 {
			return "not catching up (nothing handled)"
		}
		return "not catching up (lag steady)"
	case etaMeasuring:
		return fmt.Sprintf("measuring (%d of %d samples)", e.Points, e.PointsNeed)
	case etaUnassigned:
		return "no partition assigned"
	}
	return ""
}

// fmtETA is "~N s" under two minutes, then minutes, then hours.
func fmtETA(s float64) string {
	switch {
	case s < 120:
		return fmt.Sprintf("~%d s", int64(math.Ceil(s)))
	case s < 120*60:
		return fmt.Sprintf("~%d min", int64(math.Round(s/60)))
	}
	return fmt.Sprintf("~%d h", int64(math.Round(s/3600)))
}

// fmtRate is a rate for people: 0.4, 12, 1,234.
func fmtRate(r float64) string {
	switch {
	case r < 0 || math.IsNaN(r):
		return "0"
	case r < 10:
		return strconv.FormatFloat(math.Round(r*10)/10, 'f', -1, 64)
	}
	return inspect.FormatCount(int64(math.Round(r)))
}

// handledRates is the handled rate, messages per second, between each two
// points: one value fewer than pts.
func handledRates(pts []trendPoint) []float64 {
	if len(pts) < 2 {
		return nil
	}
	out := make([]float64, 0, len(pts)-1)
	for i := 1; i < len(pts); i++ {
		dt := float64(pts[i].at-pts[i-1].at) / float64(time.Second)
		r := 0.0
		if dt > 0 && pts[i].handled >= pts[i-1].handled {
			r = float64(pts[i].handled-pts[i-1].handled) / dt
		}
		out = append(out, r)
	}
	return out
}

func lags(pts []trendPoint) []float64 {
	out := make([]float64, len(pts))
	for i, p := range pts {
		out[i] = float64(p.lag)
	}
	return out
}

// sparkline draws vals, oldest first, as an inline SVG of w by h pixels: a
// line from 0 (the bottom, or the least value when one is negative) to the
// greatest value (the top), its area shaded, the last value dotted; at
// most w/2 points (neighbours averaged). No data draws the baseline alone.
// label names it for screen readers and as its tooltip; it is escaped.
func sparkline(vals []float64, w, h int, label string) template.HTML {
	const pad = 2.0
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="spark" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s"><title>%s</title>`,
		w, h, w, h, template.HTMLEscapeString(label), template.HTMLEscapeString(label))
	bottom := float64(h) - pad
	fmt.Fprintf(&b, `<line class="base" x1="0" y1="%.1f" x2="%d" y2="%.1f" stroke="#d0d7de" stroke-width="1"/>`, bottom, w, bottom)
	vals = downsample(vals, max(w/2, 2))
	if len(vals) > 0 {
		lo, hi := 0.0, 0.0
		for i, v := range vals {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				vals[i], v = 0, 0
			}
			lo, hi = min(lo, v), max(hi, v)
		}
		span := hi - lo
		if span == 0 {
			span = 1
		}
		xs := func(i int) float64 {
			if len(vals) == 1 {
				return float64(w) - pad
			}
			return pad + float64(i)*(float64(w)-2*pad)/float64(len(vals)-1)
		}
		ys := func(v float64) float64 { return bottom - (v-lo)/span*(float64(h)-2*pad) }
		var pts strings.Builder
		for i, v := range vals {
			if i > 0 {
				pts.WriteByte(' ')
			}
			fmt.Fprintf(&pts, "%.1f,%.1f", xs(i), ys(v))
		}
		if len(vals) > 1 {
			fmt.Fprintf(&b, `<polygon points="%.1f,%.1f %s %.1f,%.1f" fill="#0969da" fill-opacity="0.12" stroke="none"/>`,
				xs(0), bottom, pts.String(), xs(len(vals)-1), bottom)
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="#0969da" stroke-width="1.5" stroke-linejoin="round"/>`, pts.String())
		}
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2" fill="#0969da"/>`, xs(len(vals)-1), ys(vals[len(vals)-1]))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // only numbers and the escaped label
}

// downsample averages vals into at most n points, keeping the last value
// as the last point; vals itself when it is short enough (a copy).
func downsample(vals []float64, n int) []float64 {
	if len(vals) <= n {
		return slices.Clone(vals)
	}
	out := make([]float64, n)
	for i := range out {
		from, to := i*len(vals)/n, (i+1)*len(vals)/n
		sum := 0.0
		for _, v := range vals[from:to] {
			sum += v
		}
		out[i] = sum / float64(to-from)
	}
	out[n-1] = vals[len(vals)-1]
	return out
}

// The trends in /status.json: "trend", beside the snapshot's fields.
// sampled_at are the overall samples' times; a partition's series are
// those of the last len(lag) of them. handled_per_second has one value
// fewer than lag: the rate between each two samples.
type trendJSON struct {
	IntervalNs       int64           `json:"interval_ns"`
	EstimateWindowNs int64           `json:"estimate_window_ns"`
	PartitionsLimit  int             `json:"partitions_limit"`
	SampledAt        []time.Time     `json:"sampled_at"`
	Overall          trendSeriesJSON `json:"overall"`
	Partitions       []partTrendJSON `json:"partitions"`
}

type trendSeriesJSON struct {
	Lag              []int64      `json:"lag"`
	HandledPerSecond []float64    `json:"handled_per_second"`
	Estimate         estimateJSON `json:"estimate"`
}

type partTrendJSON struct {
	Topic     string `json:"topic"`
	Partition int    `json:"partition"`
	trendSeriesJSON
}

type estimateJSON struct {
	State             string  `json:"state"`
	Text              string  `json:"text"`
	ETASeconds        float64 `json:"eta_seconds,omitempty"`
	HandledPerSecond  float64 `json:"handled_per_second"`
	ProducedPerSecond float64 `json:"produced_per_second"`
}

func (d *trendData) json() trendJSON {
	j := trendJSON{IntervalNs: int64(trendInterval), EstimateWindowNs: int64(trendETAWindow), PartitionsLimit: trendPartitions,
		Overall: seriesJSON(d.overall, d.est), Partitions: []partTrendJSON{}}
	for _, p := range d.overall {
		j.SampledAt = append(j.SampledAt, time.Unix(0, p.at).UTC())
	}
	for tp, p := range d.parts {
		j.Partitions = append(j.Partitions, partTrendJSON{Topic: tp.topic, Partition: int(tp.partition), trendSeriesJSON: seriesJSON(p.points, p.est)})
	}
	slices.SortFunc(j.Partitions, func(a, b partTrendJSON) int {
		return cmp.Or(strings.Compare(a.Topic, b.Topic), cmp.Compare(a.Partition, b.Partition))
	})
	return j
}

func seriesJSON(pts []trendPoint, e trendEstimate) trendSeriesJSON {
	s := trendSeriesJSON{Lag: make([]int64, len(pts)), HandledPerSecond: []float64{},
		Estimate: estimateJSON{State: e.State, Text: e.Text(), ETASeconds: round1(e.Seconds),
			HandledPerSecond: round1(e.Handled), ProducedPerSecond: round1(e.Produced)}}
	for i, p := range pts {
		s.Lag[i] = p.lag
	}
	for _, r := range handledRates(pts) {
		s.HandledPerSecond = append(s.HandledPerSecond, round1(r))
	}
	return s
}

func round1(f float64) float64 { return math.Round(f*10) / 10 }
