package framework

import (
	"encoding/xml"
	"fmt"
	"html/template"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pts builds points a sample every 5 s from lags and handled counts.
func pts(lag []int64, handled []uint64) []trendPoint {
	out := make([]trendPoint, len(lag))
	for i := range lag {
		out[i] = trendPoint{at: int64(i) * int64(5*time.Second), lag: lag[i], handled: handled[i]}
	}
	return out
}

func TestTrendEstimate(t *testing.T) {
	for _, tc := range []struct {
		name              string
		pts               []trendPoint
		state             string
		seconds           float64
		handled, produced float64
		text              string
	}{
		// 1,000 handled a second, 600 produced: the lag of 8,000 shrinks
		// by 400 a second and is gone in 20 s.
		{"shrinking", pts([]int64{12000, 10000, 8000}, []uint64{0, 5000, 10000}), etaCatchingUp, 20, 1000, 600, "caught up in ~20 s"},
		// The rates over the window, not the last step: handled 200/s,
		// nothing produced, lag 3,000 at the end: 15 s.
		{"shrinking unevenly", pts([]int64{5000, 4900, 3000}, []uint64{0, 100, 2000}), etaCatchingUp, 15, 200, 0, "caught up in ~15 s"},
		{"slowly", pts([]int64{600000, 599500, 599000}, []uint64{0, 500, 1000}), etaCatchingUp, 5990, 100, 0, "caught up in ~100 min"},
		// Handled 100/s, produced 300/s: the lag grows 200/s.
		{"growing", pts([]int64{1000, 2000, 3000}, []uint64{0, 500, 1000}), etaFallingBehind, 0, 100, 300, "falling behind (lag +200/s)"},
		{"growing, nothing handled", pts([]int64{10, 20, 30}, []uint64{7, 7, 7}), etaFallingBehind, 0, 0, 2, "falling behind (lag +2/s)"},
		{"steady, handled as fast as produced", pts([]int64{5000, 5000, 5000}, []uint64{0, 1000, 2000}), etaSteady, 0, 200, 200, "not catching up (lag steady)"},
		{"steady, stopped", pts([]int64{143, 143, 143, 143}, []uint64{57, 57, 57, 57}), etaSteady, 0, 0, 0, "not catching up (nothing handled)"},
		{"zero", pts([]int64{500, 100, 0}, []uint64{0, 400, 500}), etaCaughtUp, 0, 50, 0, "caught up"},
		{"zero with one sample", pts([]int64{0}, []uint64{9}), etaCaughtUp, 0, 0, 0, "caught up"},
		{"too few samples", pts([]int64{900, 800}, []uint64{0, 100}), etaMeasuring, 0, 0, 0, "measuring (2 of 3 samples)"},
		{"no samples", nil, etaMeasuring, 0, 0, 0, "measuring (0 of 3 samples)"},
		// A lag under a second of handling is no backlog, whichever way
		// it moved between two fetches.
		{"keeping up", pts([]int64{300, 900, 800}, []uint64{0, 10000, 20000}), etaKeepingUp, 0, 2000, 2050, "keeping up (lag under 1 s of handling)"},
		{"all at one instant", []trendPoint{{at: 1, lag: 5}, {at: 1, lag: 4}, {at: 1, lag: 3}}, etaMeasuring, 0, 0, 0, "measuring (3 of 3 samples)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := estimateTrend(tc.pts)
			if e.State != tc.state || math.Abs(e.Seconds-tc.seconds) > 1e-9 || math.Abs(e.Handled-tc.handled) > 1e-9 || math.Abs(e.Produced-tc.produced) > 1e-9 {
				t.Errorf("got %s in %v s, handled %v/s, produced %v/s; want %s in %v s, handled %v/s, produced %v/s",
					e.State, e.Seconds, e.Handled, e.Produced, tc.state, tc.seconds, tc.handled, tc.produced)
			}
			if got := e.Text(); got != tc.text {
				t.Errorf("text %q, want %q", got, tc.text)
			}
		})
	}
}

func TestTrendETAFormat(t *testing.T) {
	for s, want := range map[float64]string{0.2: "~1 s", 20: "~20 s", 119.5: "~120 s", 120: "~2 min", 5980: "~100 min", 7200: "~2 h", 90000: "~25 h"} {
		if got := fmtETA(s); got != want {
			t.Errorf("fmtETA(%v) = %q, want %q", s, got, want)
		}
	}
	for r, want := range map[float64]string{0: "0", 0.04: "0", 2.46: "2.5", 12.4: "12", 1234.5: "1,235", 1e6: "1,000,000", -3: "0"} {
		if got := fmtRate(r); got != want {
			t.Errorf("fmtRate(%v) = %q, want %q", r, got, want)
		}
	}
}

// The window: only the last minute counts, so a burst produced before it
// no longer says "falling behind".
func TestTrendLastWindow(t *testing.T) {
	var p []trendPoint
	lag := int64(0)
	for i := range 30 { // 145 s: a burst at 20 s, drained 50/s after
		if i == 4 {
			lag = 10000
		} else if i > 4 {
			lag -= 250
		}
		p = append(p, trendPoint{at: int64(i) * int64(5*time.Second), lag: lag, handled: uint64(max(i-4, 0) * 250)})
	}
	if e := estimateTrend(p); e.State != etaFallingBehind {
		t.Fatalf("whole series: %s, want falling behind (it starts before the burst)", e.Text())
	}
	w := lastWindow(p, trendETAWindow)
	if len(w) != 13 || w[0].at != p[17].at {
		t.Fatalf("last minute: %d points from %v, want 13 from %v", len(w), w[0].at, p[17].at)
	}
	if e := estimateTrend(w); e.State != etaCatchingUp || e.Seconds != 75 {
		t.Errorf("last minute: %s (%v s), want caught up in 75 s", e.Text(), e.Seconds)
	}
	if burst := lastWindow(p[:8], trendETAWindow); estimateTrend(burst).State != etaFallingBehind {
		t.Errorf("the minute with the burst: %s, want falling behind", estimateTrend(burst).Text())
	}
	if lastWindow(nil, time.Minute) != nil {
		t.Error("lastWindow of nothing")
	}
}

func TestTrendRing(t *testing.T) {
	r := newRing[int](3)
	if r.len() != 0 || len(r.values()) != 0 {
		t.Fatal("a new ring is not empty")
	}
	for i := 1; i <= 7; i++ {
		r.push(i)
		want := []int{}
		for v := max(1, i-2); v <= i; v++ {
			want = append(want, v)
		}
		if got := r.values(); fmt.Sprint(got) != fmt.Sprint(want) || r.len() != len(want) {
			t.Fatalf("after %d pushes: %v (len %d), want %v", i, got, r.len(), want)
		}
	}
	one := newRing[int](0)
	one.push(1)
	one.push(2)
	if fmt.Sprint(one.values()) != "[2]" {
		t.Errorf("a ring of size 0 keeps %v, want the last value", one.values())
	}
}

// statsOf is a Stats of n running partitions of topic "t", partition i
// with lag lag(i) and handled(i) handled.
func statsOf(n int, rebalances uint64, lag func(int) int64, handled func(int) uint64) *Stats {
	st := &Stats{Rebalances: rebalances}
	for i := range n {
		st.Partitions = append(st.Partitions, PartitionStats{Topic: "t", Partition: i, State: StateRunning, Lag: lag(i), Handled: handled(i)})
	}
	return st
}

// The rings' bounds: trendSamples samples overall and per partition;
// trendPartitions partitions followed, those with the most lag, among
// 10,000; samples closer than 4 s dropped; revoked partitions not followed.
func TestTrendBounds(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	var one trend
	for i := range trendSamples + 30 {
		at := t0.Add(time.Duration(i) * trendInterval)
		st := statsOf(1, 1, func(int) int64 { return int64(i) }, func(int) uint64 { return uint64(i) })
		if !one.add(at, st) {
			t.Fatalf("sample %d dropped", i)
		}
		if one.add(at.Add(3*time.Second), st) {
			t.Fatalf("sample %d taken again 3 s later", i)
		}
	}
	if n, pn := one.totals.len(), one.parts[topicPartition{"t", 0}].samples.len(); n != trendSamples || pn != trendSamples {
		t.Errorf("rings hold %d samples overall, %d for the partition; want %d", n, pn, trendSamples)
	}
	if d := one.data(); d.overall[0].lag != 30 || d.overall[trendSamples-1].lag != trendSamples+29 {
		t.Errorf("the ring kept samples %d to %d, want the last %d", d.overall[0].lag, d.overall[trendSamples-1].lag, trendSamples)
	}

	// 10,000 partitions: partition p lags p messages; at sample 3,
	// partitions 0-99 jump to the top.
	var tr trend
	const parts, samples = 10_000, 6
	st := statsOf(parts, 1, func(p int) int64 { return int64(p) }, func(int) uint64 { return 0 })
	for i := range samples {
		for p := range st.Partitions {
			st.Partitions[p].Handled = uint64(i * p)
			if i >= 3 && p < 100 {
				st.Partitions[p].Lag = int64(1_000_000 + p)
			}
		}
		tr.add(t0.Add(time.Duration(i)*trendInterval), st)
		if len(tr.parts) != trendPartitions {
			t.Fatalf("sample %d: %d partitions followed, want %d", i, len(tr.parts), trendPartitions)
		}
	}
	for tp, pt := range tr.parts {
		if tp.partition >= 100 {
			t.Errorf("partition %d followed, not among the %d with the most lag", tp.partition, trendPartitions)
		}
		if n := pt.samples.len(); n != samples-3 {
			t.Errorf("partition %d: %d samples, want %d (followed since sample 3)", tp.partition, n, samples-3)
		}
	}
	if cap(tr.pick) > 2*parts {
		t.Errorf("selection scratch of %d entries for %d partitions", cap(tr.pick), parts)
	}
	d := tr.data()
	if len(d.overall) != samples || len(d.parts) != trendPartitions {
		t.Fatalf("data: %d samples, %d partitions", len(d.overall), len(d.parts))
	}
	p5 := d.parts[topicPartition{"t", 5}]
	if len(p5.points) != 3 || p5.points[2].at != d.overall[samples-1].at || p5.points[0].at != d.overall[3].at {
		t.Errorf("partition 5's points do not end with the overall ones")
	} else if p5.points[2].lag != 1_000_005 || p5.points[2].handled != uint64(5*5) {
		t.Errorf("partition 5's last point: %+v", p5.points[2])
	}

	// On a tie the partitions followed stay; a revoked one leaves.
	var tie trend
	flat := func(int) int64 { return 7 }
	none := func(int) uint64 { return 0 }
	tie.add(t0, statsOf(trendPartitions, 1, flat, none))
	st = statsOf(trendPartitions+50, 1, flat, none)
	st.Partitions[3].State = StateRevoked
	tie.add(t0.Add(trendInterval), st)
	if _, ok := tie.parts[topicPartition{"t", 3}]; ok {
		t.Error("revoked partition 3 still followed")
	}
	for i := range trendPartitions {
		if _, ok := tie.parts[topicPartition{"t", int32(i)}]; !ok && i != 3 {
			t.Errorf("partition %d, followed, lost its trend to a partition with as much lag", i)
		}
	}
	if len(tie.parts) != trendPartitions {
		t.Errorf("%d followed after the tie, want %d", len(tie.parts), trendPartitions)
	}
	if tie.totals.at(1).owned != trendPartitions+49 || tie.totals.at(1).lag != 7*(trendPartitions+49) {
		t.Errorf("overall sample: %+v", tie.totals.at(1))
	}
}

// A rebalance makes the overall lag jump: the estimate looks at the
// samples of the current assignment only.
func TestTrendAssignmentChange(t *testing.T) {
	var tr trend
	t0 := time.Unix(1_800_000_000, 0)
	add := func(i int, rebalances uint64, lag int64, handled uint64) {
		tr.add(t0.Add(time.Duration(i)*trendInterval), statsOf(1, rebalances, func(int) int64 { return lag }, func(int) uint64 { return handled }))
	}
	if tr.data() != nil {
		t.Fatal("data before any sample")
	}
	tr.add(t0, &Stats{})
	if d := tr.data(); d.est.State != etaUnassigned || d.est.Text() != "no partition assigned" {
		t.Errorf("no partition: %s", d.est.Text())
	}
	add(1, 1, 1000, 0)
	add(2, 1, 900, 100)
	add(3, 2, 5000, 200) // a partition with a backlog assigned: 5,000 in all
	if d := tr.data(); d.est.State != etaMeasuring {
		t.Errorf("first sample of a new assignment: %s, want measuring", d.est.Text())
	}
	add(4, 2, 4500, 700)
	add(5, 2, 4000, 1200)
	d := tr.data()
	if d.est.State != etaCatchingUp || d.est.Seconds != 40 {
		t.Errorf("after the rebalance: %s (%v s), want catching up in 40 s", d.est.Text(), d.est.Seconds)
	}
	if len(d.overall) != 6 {
		t.Errorf("the sparkline has %d points, want all 6", len(d.overall))
	}
	tr.from("1 2") // the first source: afresh
	add(6, 2, 3500, 1700)
	tr.from("1 2")
	if d := tr.data(); d == nil || len(d.overall) != 1 {
		t.Fatal("the trend was not kept for the same source")
	}
	tr.from("other process")
	if tr.data() != nil {
		t.Error("the trend was kept across a change of source")
	}
}

// svgDoc is what the tests read of a sparkline.
type svgDoc struct {
	XMLName  xml.Name `xml:"svg"`
	Width    int      `xml:"width,attr"`
	Height   int      `xml:"height,attr"`
	Label    string   `xml:"aria-label,attr"`
	Title    string   `xml:"title"`
	Polyline *struct {
		Points string `xml:"points,attr"`
	} `xml:"polyline"`
	Circle *struct {
		CX float64 `xml:"cx,attr"`
		CY float64 `xml:"cy,attr"`
	} `xml:"circle"`
}

func parseSVG(t *testing.T, h template.HTML) svgDoc {
	t.Helper()
	var d svgDoc
	dec := xml.NewDecoder(strings.NewReader(string(h)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("not valid SVG: %v\n%s", err, h)
	}
	if _, err := dec.Token(); err != io.EOF {
		t.Fatalf("something after the svg element: %v\n%s", err, h)
	}
	return d
}

func points(t *testing.T, s string) [][2]float64 {
	t.Helper()
	var out [][2]float64
	for _, p := range strings.Fields(s) {
		x, y, ok := strings.Cut(p, ",")
		fx, err1 := strconv.ParseFloat(x, 64)
		fy, err2 := strconv.ParseFloat(y, 64)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("bad point %q", p)
		}
		out = append(out, [2]float64{fx, fy})
	}
	return out
}

func TestTrendSparkline(t *testing.T) {
	d := parseSVG(t, sparkline([]float64{0, 50, 100, 25}, 100, 20, `lag <b>&"x"`))
	if d.Width != 100 || d.Height != 20 || d.Label != `lag <b>&"x"` || d.Title != `lag <b>&"x"` {
		t.Errorf("svg %dx%d label %q title %q", d.Width, d.Height, d.Label, d.Title)
	}
	if d.Polyline == nil {
		t.Fatal("no polyline")
	}
	p := points(t, d.Polyline.Points)
	// x from 2 to 98 in 3 steps; 0 at the bottom (18), 100 at the top (2).
	want := [][2]float64{{2, 18}, {34, 10}, {66, 2}, {98, 14}}
	if fmt.Sprint(p) != fmt.Sprint(want) {
		t.Errorf("points %v, want %v", p, want)
	}
	if d.Circle == nil || d.Circle.CX != 98 || d.Circle.CY != 14 {
		t.Errorf("last point dot %+v, want at 98,14", d.Circle)
	}

	// Empty: the baseline alone.
	if e := parseSVG(t, sparkline(nil, 96, 20, "x")); e.Polyline != nil || e.Circle != nil {
		t.Errorf("empty data drew %+v", e)
	}
	// One value: a dot at the right end; a flat zero line at the bottom;
	// bad values drawn as 0.
	if one := parseSVG(t, sparkline([]float64{5}, 96, 20, "x")); one.Polyline != nil || one.Circle == nil || one.Circle.CX != 94 || one.Circle.CY != 2 {
		t.Errorf("one value: %+v", one)
	}
	for _, pt := range points(t, parseSVG(t, sparkline([]float64{0, 0, math.NaN(), math.Inf(1)}, 96, 20, "x")).Polyline.Points) {
		if pt[1] != 18 {
			t.Errorf("zeros drawn at y %v, want the bottom (18)", pt[1])
		}
	}
	// Negative values lower the bottom.
	if p := points(t, parseSVG(t, sparkline([]float64{-10, 10}, 96, 20, "x")).Polyline.Points); p[0][1] != 18 || p[1][1] != 2 {
		t.Errorf("negative values: %v", p)
	}
	// Long series: at most w/2 points, within the box, the last value last.
	long := make([]float64, 1000)
	for i := range long {
		long[i] = float64(i % 7)
	}
	long[999] = 100
	lp := points(t, parseSVG(t, sparkline(long, 96, 20, "x")).Polyline.Points)
	if len(lp) != 48 {
		t.Errorf("%d points for a 96 px sparkline, want 48", len(lp))
	}
	for _, pt := range lp {
		if pt[0] < 0 || pt[0] > 96 || pt[1] < 0 || pt[1] > 20 {
			t.Errorf("point %v outside the 96x20 box", pt)
		}
	}
	if last := lp[len(lp)-1]; last[1] != 2 {
		t.Errorf("the last (greatest) value drawn at y %v, want the top", last[1])
	}
}
