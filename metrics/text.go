package metrics

import (
	"bytes"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/klauspost/compress/gzip"
	"github.com/prometheus/common/expfmt"

	"github.com/tidemark/tidemark/framework"
)

// The text exposition (format 0.0.4), written straight from a snapshot:
// Handler's path for every scrape that accepts text, which Prometheus
// always does. Going through a registry costs about 2.5 µs a series
// (a const metric, its protobuf form, the registry's checks and sort, the
// encoder); a consumer of 1,000 partitions exports about 29,000 series, so
// a scrape would cost about 75 ms of CPU. Written here, a series costs an
// append of bytes. The registry path (Collect) stays for the other formats
// and for users' own registries; TestTextMatchesRegistry checks the two
// agree series for series.

// textContentType is the text format's Content-Type.
var textContentType = string(expfmt.NewFormat(expfmt.TypeTextPlain))

// textSink collects one snapshot's series, one buffer per metric: the
// format wants a metric's series together, after its HELP and TYPE lines,
// and emit sends them partition by partition.
type textSink struct {
	col  *Collector
	bufs [numMetrics][]byte
	// The label pairs of the last label values seen, already escaped:
	// emit sends all of a partition's series in a row.
	last            labels
	prefix, scratch []byte
}

var textSinks = sync.Pool{New: func() any { return new(textSink) }}

// labelPairs returns l as `name="value",...`, escaped, for metric i. The
// pairs of the series' identity (its group, or its group, topic and
// partition) are kept from the last call: emit sends a partition's series
// in a row.
func (t *textSink) labelPairs(i int, l labels) []byte {
	names := defs[i].labels
	k := 1
	if len(names) >= 3 && names[1] == labelTopic {
		k = 3
	}
	k = min(k, l.n, len(names))
	key := labels{n: k}
	copy(key.v[:k], l.v[:k])
	if key != t.last || t.prefix == nil {
		t.last = key
		t.prefix = appendPairs(t.prefix[:0], names[:k], l.v[:k])
	}
	if l.n == k {
		return t.prefix
	}
	t.scratch = append(t.scratch[:0], t.prefix...)
	t.scratch = append(t.scratch, ',')
	t.scratch = appendPairs(t.scratch, names[k:min(l.n, len(names))], l.v[k:l.n])
	return t.scratch
}

func appendPairs(b []byte, names, values []string) []byte {
	for j, name := range names {
		if j > 0 {
			b = append(b, ',')
		}
		b = append(b, name...)
		b = append(b, '=', '"')
		b = appendEscaped(b, values[j])
		b = append(b, '"')
	}
	return b
}

func (t *textSink) metric(i int, v float64, l labels) {
	b := append(t.bufs[i], defs[i].name...)
	b = append(b, '{')
	b = append(b, t.labelPairs(i, l)...)
	b = append(b, '}', ' ')
	b = appendFloat(b, v)
	t.bufs[i] = append(b, '\n')
}

func (t *textSink) histogram(i int, h *framework.Histogram, l labels) {
	name := defs[i].name
	pairs := t.labelPairs(i, l)
	b := t.bufs[i]
	bucket := func(le []byte, n uint64) {
		b = append(b, name...)
		b = append(b, "_bucket{"...)
		b = append(b, pairs...)
		b = append(b, `,le="`...)
		b = append(b, le...)
		b = append(b, '"', '}', ' ')
		b = strconv.AppendUint(b, n, 10)
		b = append(b, '\n')
	}
	var le []byte
	t.col.cumulative(h, func(bound float64, n uint64) {
		le = appendFloat(le[:0], bound)
		bucket(le, n)
	})
	bucket([]byte("+Inf"), h.Count)
	for _, s := range [...]struct {
		suffix string
		v      float64
	}{{"_sum", h.Sum.Seconds()}, {"_count", float64(h.Count)}} {
		b = append(b, name...)
		b = append(b, s.suffix...)
		b = append(b, '{')
		b = append(b, pairs...)
		b = append(b, '}', ' ')
		b = appendFloat(b, s.v)
		b = append(b, '\n')
	}
	t.bufs[i] = b
}

// writeText writes one snapshot's exposition to w.
func (col *Collector) writeText(w *bytes.Buffer) {
	t := textSinks.Get().(*textSink)
	t.col, t.last, t.prefix = col, labels{}, t.prefix[:0]
	for i := range t.bufs {
		t.bufs[i] = t.bufs[i][:0]
	}
	col.emit(col.stats(), t)
	for i, b := range t.bufs {
		if len(b) == 0 {
			continue
		}
		d := defs[i]
		w.WriteString("# HELP ")
		w.WriteString(d.name)
		w.WriteByte(' ')
		w.WriteString(helpEscaper.Replace(d.help))
		w.WriteString("\n# TYPE ")
		w.WriteString(d.name)
		w.WriteString([...]string{counter: " counter\n", gauge: " gauge\n", histogram: " histogram\n"}[d.kind])
		w.Write(b)
	}
	t.col, t.last = nil, labels{}
	textSinks.Put(t)
}

var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

// appendEscaped appends a label value escaped as the text format wants:
// backslash, double quote and newline.
func appendEscaped(b []byte, s string) []byte {
	if !strings.ContainsAny(s, "\\\"\n") {
		return append(b, s...)
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b = append(b, `\\`...)
		case '"':
			b = append(b, `\"`...)
		case '\n':
			b = append(b, `\n`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// appendFloat formats v for the text format: whole numbers in full (up to
// 1e15), others as the text encoder of prometheus/common does.
func appendFloat(b []byte, v float64) []byte {
	switch {
	case v == 0:
		return append(b, '0')
	case v == 1:
		return append(b, '1')
	case math.IsNaN(v):
		return append(b, "NaN"...)
	case math.IsInf(v, 1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		return strconv.AppendInt(b, int64(v), 10)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

// handler is Handler's http.Handler: the text exposition written from the
// snapshot, or promhttp over the registry for a client that wants another
// format (protobuf).
type handler struct {
	col  *Collector
	prom http.Handler
}

var (
	bufs    = sync.Pool{New: func() any { return new(bytes.Buffer) }}
	gzipper = sync.Pool{New: func() any {
		w, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed) // a valid level: no error
		return w
	}}
)

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if expfmt.Negotiate(r.Header).FormatType() != expfmt.TypeTextPlain {
		h.prom.ServeHTTP(w, r)
		return
	}
	buf := bufs.Get().(*bytes.Buffer)
	buf.Reset()
	defer bufs.Put(buf)
	h.col.writeText(buf)
	w.Header().Set("Content-Type", textContentType)
	if !acceptsGzip(r.Header.Get("Accept-Encoding")) {
		w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
		_, _ = w.Write(buf.Bytes()) // the client went away: nothing to do
		return
	}
	w.Header().Set("Content-Encoding", "gzip")
	w.Header().Add("Vary", "Accept-Encoding")
	gz := gzipper.Get().(*gzip.Writer)
	defer gzipper.Put(gz)
	gz.Reset(w)
	_, _ = gz.Write(buf.Bytes())
	_ = gz.Close()
}

// acceptsGzip reports whether an Accept-Encoding header admits gzip.
func acceptsGzip(h string) bool {
	for _, part := range strings.Split(h, ",") {
		enc, params, _ := strings.Cut(strings.TrimSpace(part), ";")
		if !strings.EqualFold(strings.TrimSpace(enc), "gzip") {
			continue
		}
		q := strings.ReplaceAll(params, " ", "")
		return q != "q=0" && q != "q=0.0" && q != "q=0.00" && q != "q=0.000"
	}
	return false
}
