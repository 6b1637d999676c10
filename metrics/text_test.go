package metrics

import (
	"compress/gzip"
	"fmt"
	"io"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tidemark/tidemark/framework"
)

// serve serves one request and returns the response's Content-Type,
// Content-Encoding and body, gunzipped.
func serve(t *testing.T, h *handler, accept, encoding string) (ctype, cenc, body string) {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if encoding != "" {
		req.Header.Set("Accept-Encoding", encoding)
	}
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body.String())
	}
	ctype, cenc = rec.Header().Get("Content-Type"), rec.Header().Get("Content-Encoding")
	var r io.Reader = rec.Body
	if cenc == "gzip" {
		zr, err := gzip.NewReader(rec.Body)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	}
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return ctype, cenc, string(b)
}

// canonical parses a text exposition and renders every series as one
// line, "name{labels sorted} value", sorted, with each family's HELP and
// TYPE.
func canonical(t *testing.T, body string) string {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("%v\n%s", err, body)
	}
	var lines []string
	for name, f := range fams {
		lines = append(lines, fmt.Sprintf("%s %s %q", name, f.GetType(), f.GetHelp()))
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(ls)
			v := fmt.Sprint(m.GetGauge().GetValue() + m.GetCounter().GetValue())
			if h := m.GetHistogram(); h != nil {
				v = fmt.Sprintf("count=%d sum=%v", h.GetSampleCount(), h.GetSampleSum())
				for _, b := range h.GetBucket() {
					v += fmt.Sprintf(" le%v=%d", b.GetUpperBound(), b.GetCumulativeCount())
				}
			}
			lines = append(lines, fmt.Sprintf("%s{%s} %s", name, strings.Join(ls, ","), v))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestTextMatchesRegistry: Handler's text, written straight from the
// snapshot, holds exactly the series, values, help and types the
// registry path (promhttp over Collect) gives, escaping included; gzip
// when asked; other formats go to promhttp.
func TestTextMatchesRegistry(t *testing.T) {
	s := synthetic(3)
	s.Group = "a \"quoted\" group\\with\na newline" // Kafka allows any group id
	s.Partitions[2].Topic = "orders.v2_x-y"
	s.Partitions[3].State = "made-up"
	col, err := newCollector(func() framework.Stats { return s })
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	h := &handler{col: col, prom: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}

	ctype, cenc, text := serve(t, h, prometheusAccept, "gzip, deflate")
	if !strings.HasPrefix(ctype, "text/plain; version=0.0.4") || cenc != "gzip" {
		t.Errorf("a Prometheus scrape got Content-Type %q, Content-Encoding %q; want text 0.0.4, gzip", ctype, cenc)
	}
	protobuf := "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0.7,text/plain;version=0.0.4;q=0.3"
	if ctype, _, _ := serve(t, h, protobuf, ""); !strings.Contains(ctype, "protobuf") {
		t.Errorf("a protobuf scrape got Content-Type %q, want promhttp's protobuf", ctype)
	}
	rec := httptest.NewRecorder() // the registry's own text
	h.prom.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if got, want := canonical(t, text), canonical(t, rec.Body.String()); got != want {
		t.Errorf("the text path and the registry differ:\n--- text\n%s\n--- registry\n%s", got, want)
	}
	if !strings.Contains(text, `group="a \"quoted\" group\\with\na newline"`) {
		t.Errorf("the group is not escaped as the format wants:\n%s", text[:min(len(text), 600)])
	}
	for _, enc := range []string{"", "identity", "gzip;q=0", "br"} {
		if _, cenc, plain := serve(t, h, "", enc); cenc != "" || canonical(t, plain) != canonical(t, text) {
			t.Errorf("Accept-Encoding %q: Content-Encoding %q, or another body", enc, cenc)
		}
	}
}
