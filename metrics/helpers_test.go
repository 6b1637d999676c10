package metrics_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The package's own helpers: a scrape as Prometheus does it, and lookups
// in its result. The consumer and the broker come from
// internal/testsupport.

// scrape GETs the handler as Prometheus does and returns the body and the
// metric families parsed back from it.
func scrape(t testing.TB, h http.Handler) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("GET /metrics: %d %s", rec.Code, rec.Body.String())
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("GET /metrics: Content-Type %q, want the text format", ct)
	}
	body := rec.Body.String()
	p := expfmt.NewTextParser(model.LegacyValidation) // names Prometheus 2 accepts too
	families, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parsing the exposition: %v\n%s", err, body)
	}
	return body, families
}

// series finds the one series of family name whose labels include want,
// and returns its value (a histogram: its count).
func series(t testing.TB, families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	v, ok := lookup(families, name, want)
	if !ok {
		t.Fatalf("no series %s%v in the exposition", name, want)
	}
	return v
}

func lookup(families map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := families[name]
	if f == nil {
		return 0, false
	}
	found, v := 0, 0.0
next:
	for _, m := range f.GetMetric() {
		for k, val := range want {
			match := false
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == k && l.GetValue() == val)
			}
			if !match {
				continue next
			}
		}
		found++
		switch {
		case m.Counter != nil:
			v = m.GetCounter().GetValue()
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		case m.Histogram != nil:
			v = float64(m.GetHistogram().GetSampleCount())
		case m.Untyped != nil:
			v = m.GetUntyped().GetValue()
		}
	}
	return v, found == 1
}
