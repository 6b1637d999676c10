package metrics

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/tidemark/tidemark/framework"
)

// synthetic is a snapshot with a partition in every state, every flag set
// somewhere, and one partition whose positions are not known yet; offsets,
// errors and counters are derived from seed, so that two seeds give the
// same partitions with different figures.
func synthetic(seed int64) framework.Stats {
	h := func(n uint64) framework.Histogram {
		c := make([]uint64, len(framework.LatencyBounds)+1)
		c[3], c[len(c)-1] = n, 1
		return framework.Histogram{Bounds: framework.LatencyBounds, Counts: c, Count: n + 1, Sum: time.Duration(n) * time.Millisecond}
	}
	s := framework.Stats{
		Group: "g", Generation: int32(seed), Member: fmt.Sprintf("member-%d", seed), BufferedBytes: seed * 100,
		GroupProtocol: framework.GroupProtocolConsumer, MemberEpoch: int32(seed), StateChangelog: "-state", StateRebuild: true,
		FetchRequests: uint64(seed) * 7, FetchSessionResets: uint64(seed) * 3, OffsetFileError: fmt.Sprintf("write offsets.db: disk full %d", seed),
		Rebalances: uint64(seed), RebalanceTime: time.Duration(seed) * time.Second, Rebalancing: seed%2 == 0, PartitionsLost: uint64(seed),
		Commits:        framework.CommitCounts{OK: uint64(seed), Fenced: 1, Error: 2, Unknown: 3},
		HandlerLatency: h(uint64(seed)), FlushLatency: h(uint64(2 * seed)),
	}
	for i, st := range framework.PartitionStates() {
		o := seed*1000 + int64(i)
		s.Partitions = append(s.Partitions, framework.PartitionStats{
			Topic: []string{"orders", "clicks"}[i%2], Partition: i, State: st,
			Processed: o, Durable: o - seed, Committed: o - 2*seed, HighWatermark: o + 2*seed, LastStable: o + seed, Lag: seed,
			TransactionWait: time.Duration(seed) * time.Second, Aborted: uint64(seed),
			Handled: uint64(o), BufferedBytes: seed, Attempts: int(seed), LastError: fmt.Sprintf("boom at offset %d", o),
			CommitError: "commit failed", LastCommit: "error", Paused: st == framework.StatePaused,
			DeadLettered: uint64(seed), Skipped: uint64(seed), UncleanRestarts: int32(seed), Careful: i%2 == 0,
			InFlight: int(seed), Waiting: int(seed), CompletedAhead: int(seed), OldestIncomplete: o, OldestAge: time.Second,
			WindowFull: i%3 == 0, DurableWait: i%2 == 1, LagTime: time.Duration(seed) * time.Second,
			HandlerErrors: uint64(seed), Retries: uint64(seed), BreakerTrips: uint64(seed), CarefulEntries: uint64(seed),
			Restoring: i%2 == 0, RestoreTotal: uint64(seed), RestoreRemaining: seed, StateRebuilds: uint64(seed),
		})
	}
	s.Partitions = append(s.Partitions, framework.PartitionStats{ // assigned, not reconciled yet
		Topic: "orders", Partition: 99, State: framework.StateReconciling,
		Processed: -1, Durable: -1, Committed: -1, HighWatermark: -1, LastStable: -1, OldestIncomplete: -1,
	})
	return s
}

// collected is one series: its metric name and labels.
type collected struct {
	name   string
	labels string
}

// collect runs Collect over s and returns every series, checking each
// metric against the descriptions Describe sent.
func collect(t *testing.T, s framework.Stats) []collected {
	t.Helper()
	col, err := newCollector(func() framework.Stats { return s })
	if err != nil {
		t.Fatal(err)
	}
	described := map[*prometheus.Desc]int{}
	dch := make(chan *prometheus.Desc, numMetrics)
	col.Describe(dch)
	close(dch)
	for d := range dch {
		for i := range col.descs {
			if col.descs[i] == d {
				described[d] = i
			}
		}
	}
	if len(described) != numMetrics {
		t.Fatalf("Describe sent %d distinct descriptions of the collector's, want %d", len(described), numMetrics)
	}

	mch := make(chan prometheus.Metric, 10000)
	col.Collect(mch)
	close(mch)
	states := map[string]bool{}
	for _, st := range framework.PartitionStates() {
		states[string(st)] = true
	}
	var out []collected
	for m := range mch {
		i, ok := described[m.Desc()]
		if !ok {
			t.Fatalf("Collect sent a metric Describe did not describe: %s", m.Desc())
		}
		d := defs[i]
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			t.Fatalf("%s: %v", d.name, err)
		}
		var names, pairs []string
		for _, l := range pb.GetLabel() {
			names = append(names, l.GetName())
			pairs = append(pairs, l.GetName()+"="+l.GetValue())
			v := l.GetValue()
			// Bounded values: the group, topics and partition numbers of
			// the snapshot, the listed states, the commit outcomes and the
			// group protocols.
			bounded := map[string]bool{
				labelGroup:     v == s.Group,
				labelTopic:     v == "orders" || v == "clicks",
				labelPartition: len(v) <= 2 && strings.Trim(v, "0123456789") == "",
				labelState:     states[v] || v == "made-up",
				labelOutcome:   slices.Contains(commitOutcomes, v),
				labelProtocol:  v == framework.GroupProtocolClassic || v == framework.GroupProtocolConsumer,
			}[l.GetName()]
			if !bounded {
				t.Errorf("%s: label %s=%q is not from a bounded set", d.name, l.GetName(), v)
			}
		}
		want := slices.Clone(d.labels)
		sort.Strings(want)
		if !slices.Equal(names, want) {
			t.Errorf("%s: labels %q, want %q", d.name, names, want)
		}
		switch d.kind {
		case counter:
			if pb.Counter == nil {
				t.Errorf("%s is not a counter", d.name)
			}
		case gauge:
			if pb.Gauge == nil {
				t.Errorf("%s is not a gauge", d.name)
			}
		case histogram:
			if pb.Histogram == nil {
				t.Errorf("%s is not a histogram", d.name)
			}
		}
		out = append(out, collected{d.name, strings.Join(pairs, ",")})
	}
	return out
}

// TestCollectorDescribesWhatItSends: every metric Collect sends was
// described, with the labels of its description, and every description
// is sent for a snapshot that has everything; label values come from
// bounded sets, and the series depend on the partitions alone, never on
// offsets, errors or counts.
func TestCollectorDescribesWhatItSends(t *testing.T) {
	a, b := collect(t, synthetic(3)), collect(t, synthetic(8))
	sent := map[string]int{}
	seen := map[collected]bool{}
	for _, c := range a {
		sent[c.name]++
		if seen[c] {
			t.Errorf("series sent twice: %v", c)
		}
		seen[c] = true
	}
	for _, d := range defs {
		if sent[d.name] == 0 {
			t.Errorf("%s is described but never sent", d.name)
		}
	}
	key := func(cs []collected) string {
		var s []string
		for _, c := range cs {
			s = append(s, c.name+"{"+c.labels+"}")
		}
		sort.Strings(s)
		return strings.Join(s, "\n")
	}
	if key(a) != key(b) {
		t.Errorf("two snapshots of the same partitions with different figures give different series:\n%s\n---\n%s", key(a), key(b))
	}
	for _, c := range a {
		if strings.Contains(c.labels, "boom") || strings.Contains(c.labels, "disk full") || strings.Contains(c.labels, "member-") {
			t.Errorf("an error text or member id in a label: %v", c)
		}
	}

	// Per partition, the same number of series whatever its figures: the
	// owned ones all of them, the revoked one its counters and states.
	perOwned := 0
	for _, c := range a {
		if strings.Contains(c.labels, "partition=1,") {
			perOwned++
		}
	}
	if want := 8 + len(framework.PartitionStates()) + 18; perOwned != want {
		t.Errorf("%d series for an owned partition, want %d", perOwned, want)
	}
	s := synthetic(3)
	s.Partitions = append(s.Partitions, s.Partitions[0])
	s.Partitions[len(s.Partitions)-1].Partition = 42
	if got := len(collect(t, s)) - len(a); got != perOwned {
		t.Errorf("one more partition added %d series, want %d", got, perOwned)
	}

	// A partition whose positions are unknown sends no position, and a
	// revoked one no gauge: its counters and states only.
	for _, c := range a {
		unknown := strings.Contains(c.labels, "partition=99,")
		revoked := strings.Contains(c.labels, fmt.Sprintf("partition=%d,", len(framework.PartitionStates())-1))
		position := strings.HasSuffix(c.name, "_offset") || c.name == "tidemark_lag_messages" || c.name == "tidemark_lag_seconds" ||
			c.name == "tidemark_undurable_messages" || c.name == "tidemark_uncommitted_messages" ||
			c.name == "tidemark_transaction_wait_seconds"
		if unknown && position {
			t.Errorf("an unknown position sent: %v", c)
		}
		if revoked && defs[index(c.name)].kind == gauge && c.name != "tidemark_partition_state" {
			t.Errorf("a revoked partition's gauge sent: %v", c)
		}
	}
}

func index(name string) int {
	for i, d := range defs {
		if d.name == name {
			return i
		}
	}
	return -1
}

// TestCollectorValues checks the values derived from a snapshot.
func TestCollectorValues(t *testing.T) {
	s := synthetic(3)
	reg := prometheus.NewPedanticRegistry()
	col, err := newCollector(func() framework.Stats { return s })
	if err != nil {
		t.Fatal(err)
	}
	reg.MustRegister(col)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	problems, err := promlint.NewWithMetricFamilies(fams).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	values := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			var l []string
			for _, p := range m.GetLabel() {
				if p.GetName() != labelGroup && p.GetName() != labelTopic {
					l = append(l, p.GetName()+"="+p.GetValue())
				}
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
			values[f.GetName()+"{"+strings.Join(l, ",")+"}"] = v
		}
	}
	p1 := s.Partitions[1] // running
	for k, want := range map[string]float64{
		"tidemark_processed_offset{partition=1}":                     float64(p1.Processed),
		"tidemark_undurable_messages{partition=1}":                   float64(p1.Processed - p1.Durable),
		"tidemark_uncommitted_messages{partition=1}":                 float64(p1.Durable - p1.Committed),
		"tidemark_lag_seconds{partition=1}":                          3,
		"tidemark_partition_state{partition=1,state=running}":        1,
		"tidemark_partition_state{partition=1,state=paused}":         0,
		"tidemark_partition_state{partition=99,state=reconciling}":   1,
		"tidemark_partitions{state=reconciling}":                     2,
		"tidemark_partitions{state=revoked}":                         1,
		"tidemark_careful_mode{partition=0}":                         1,
		"tidemark_careful_mode{partition=1}":                         0,
		"tidemark_durable_wait{partition=1}":                         1,
		"tidemark_window_full{partition=3}":                          1,
		"tidemark_breaker_trips_total{}":                             3 * float64(len(framework.PartitionStates())),
		"tidemark_commits_total{outcome=unknown}":                    3,
		"tidemark_group_protocol{protocol=consumer}":                 1,
		"tidemark_member_epoch{}":                                    3,
		"tidemark_generation{}":                                      3,
		"tidemark_rebalance_seconds_total{}":                         3,
		"tidemark_offset_file_error{}":                               1,
		"tidemark_handler_duration_seconds{}":                        4,
		"tidemark_offset_file_flush_duration_seconds{}":              7,
		"tidemark_handled_messages_total{partition=99}":              0,
		"tidemark_handler_errors_total{partition=8}":                 3, // revoked: counters stay
		"tidemark_partition_state{partition=8,state=revoked}":        1,
		"tidemark_partition_state{partition=8,state=dead-lettering}": 0,
	} {
		if got, ok := values[k]; !ok || got != want {
			t.Errorf("%s = %v (found %v), want %v", k, got, ok, want)
		}
	}

	// A state framework.PartitionStates does not list is still shown.
	s.Partitions[1].State = "made-up"
	fams, err = reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == "made-up" {
					n++
				}
			}
		}
	}
	if n != 2 {
		t.Errorf("an unlisted state shows in %d series, want 2 (its partition's state, the count)", n)
	}
}

// With the classic protocol the protocol's series says so, and there is
// no member epoch; a snapshot from before GroupProtocol (empty) sends
// neither.
func TestCollectorGroupProtocol(t *testing.T) {
	for _, tc := range []struct {
		protocol string
		want     []string
	}{
		{framework.GroupProtocolClassic, []string{"tidemark_group_protocol{group=g,protocol=classic}"}},
		{framework.GroupProtocolConsumer, []string{"tidemark_group_protocol{group=g,protocol=consumer}", "tidemark_member_epoch{group=g}"}},
		{"", nil},
	} {
		s := synthetic(3)
		s.GroupProtocol = tc.protocol
		if tc.protocol != framework.GroupProtocolConsumer {
			s.MemberEpoch = 0
		}
		var got []string
		for _, c := range collect(t, s) {
			if c.name == "tidemark_group_protocol" || c.name == "tidemark_member_epoch" {
				got = append(got, c.name+"{"+c.labels+"}")
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, tc.want) {
			t.Errorf("GroupProtocol %q: series %v, want %v", tc.protocol, got, tc.want)
		}
	}
}

// prometheusAccept is the Accept header of a Prometheus 3 scrape.
const prometheusAccept = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5," +
	"text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"

// thousand is a snapshot of a consumer owning 1,000 running partitions.
func thousand() framework.Stats {
	s := synthetic(3)
	base := s.Partitions[1]
	s.Partitions = s.Partitions[:0]
	for p := range 1000 {
		ps := base
		ps.Partition = p
		s.Partitions = append(s.Partitions, ps)
	}
	return s
}

// BenchmarkScrape is one scrape of a consumer owning 1,000 running
// partitions, as Prometheus asks for it, the Stats snapshot itself left
// out (a synthetic one): Handler's text path, and promhttp over a registry
// (the path of other formats, and of a Collector in a user's registry).
func BenchmarkScrape(b *testing.B) {
	s := thousand()
	col, err := newCollector(func() framework.Stats { return s })
	if err != nil {
		b.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	prom := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	text := &handler{col: col, prom: prom}
	for _, h := range []struct {
		name string
		h    http.Handler
	}{{"text", text}, {"registry", prom}} {
		for _, enc := range []string{"identity", "gzip"} {
			b.Run(h.name+"/"+enc, func(b *testing.B) {
				b.ReportAllocs()
				size := 0
				for b.Loop() {
					rec := httptest.NewRecorder()
					req := httptest.NewRequest("GET", "/metrics", nil)
					req.Header.Set("Accept", prometheusAccept)
					req.Header.Set("Accept-Encoding", enc)
					h.h.ServeHTTP(rec, req)
					if rec.Code != 200 {
						b.Fatal(rec.Code)
					}
					size = rec.Body.Len()
				}
				b.ReportMetric(float64(size), "bytes/scrape")
			})
		}
	}
}
