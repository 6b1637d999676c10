package tidemarkslog_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/tidemark/tidemark/tidemarkslog"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is a bytes.Buffer safe for the consumer's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines decodes every JSON line written so far, numbers kept as
// json.Number so that an int is told from a float.
func (s *syncBuffer) lines(t testing.TB) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if line == "" {
			continue
		}
		d := json.NewDecoder(strings.NewReader(line))
		d.UseNumber()
		var m map[string]any
		if err := d.Decode(&m); err != nil {
			t.Fatalf("a line is not JSON: %v: %s", err, line)
		}
		out = append(out, m)
	}
	return out
}

func jsonLogger(level slog.Level, source bool) (*zap.Logger, *syncBuffer) {
	var buf syncBuffer
	h := slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level, AddSource: source})
	return tidemarkslog.Logger(slog.New(h)), &buf
}

type point struct{ x, y int }

func (p point) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddInt("x", p.x)
	enc.AddInt("y", p.y)
	return nil
}

// Each zap field type arrives with its JSON type: numbers as numbers (an
// int without a fraction), bools as bools, durations as slog writes them
// (nanoseconds), times as RFC 3339, errors as their message, objects as
// nested objects, arrays as arrays.
func TestFieldTypes(t *testing.T) {
	log, buf := jsonLogger(slog.LevelDebug, false)
	at := time.Date(2026, 3, 4, 5, 6, 7, 8000, time.UTC)
	log.Info("all types",
		zap.String("s", "str"),
		zap.Int("i", -42),
		zap.Int32("i32", 7),
		zap.Uint64("u", 1<<63),
		zap.Float64("f", 1.5),
		zap.Bool("b", true),
		zap.Duration("d", 1500*time.Millisecond),
		zap.Time("t", at),
		zap.Error(errors.New("boom")),
		zap.NamedError("cause", errors.New("bang")),
		zap.Object("obj", point{1, 2}),
		zap.Dict("dict", zap.String("k", "v"), zap.Int("n", 3)),
		zap.Strings("strs", []string{"a", "b"}),
		zap.Int64s("ints", []int64{1, 2, 3}),
		zap.Objects("points", []point{{3, 4}}),
		zap.Binary("bin", []byte{0xff, 0x00}),
		zap.ByteString("bs", []byte("bytes")),
		zap.Complex128("c", complex(1, 2)),
		zap.Stringer("stringer", time.Second),
		zap.Any("any", map[string]int{"one": 1}),
		zap.Inline(point{5, 6}),
		zap.Skip(),
	)
	lines := buf.lines(t)
	if len(lines) != 1 {
		t.Fatalf("got %d lines, want 1", len(lines))
	}
	got := lines[0]
	want := map[string]any{
		"level":    "INFO",
		"msg":      "all types",
		"s":        "str",
		"i":        json.Number("-42"),
		"i32":      json.Number("7"),
		"u":        json.Number("9223372036854775808"),
		"f":        json.Number("1.5"),
		"b":        true,
		"d":        json.Number("1500000000"),
		"t":        "2026-03-04T05:06:07.000008Z",
		"error":    "boom",
		"cause":    "bang",
		"obj":      map[string]any{"x": json.Number("1"), "y": json.Number("2")},
		"dict":     map[string]any{"k": "v", "n": json.Number("3")},
		"strs":     []any{"a", "b"},
		"ints":     []any{json.Number("1"), json.Number("2"), json.Number("3")},
		"points":   []any{map[string]any{"x": json.Number("3"), "y": json.Number("4")}},
		"bin":      "/wA=",
		"bs":       "bytes",
		"c":        "(1+2i)",
		"stringer": "1s",
		"any":      map[string]any{"one": json.Number("1")},
		"x":        json.Number("5"),
		"y":        json.Number("6"),
	}
	delete(got, "time")
	for k, w := range want {
		if g, ok := got[k]; !ok {
			t.Errorf("%s: missing", k)
		} else if !jsonEqual(g, w) {
			t.Errorf("%s = %s, want %s", k, js(g), js(w))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected key %s = %#v", k, got[k])
		}
	}
}

func jsonEqual(a, b any) bool { return js(a) == js(b) }

// js is v as JSON: a number and a string holding it differ.
func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// The attrs reach the handler with their slog kinds, not only as JSON
// text: a ReplaceAttr sees an Int64, a Duration, a Time and the error
// itself.
func TestAttrKinds(t *testing.T) {
	var mu sync.Mutex
	kinds := map[string]slog.Kind{}
	var gotErr error
	sentinel := errors.New("sentinel")
	h := slog.NewJSONHandler(&bytes.Buffer{}, &slog.HandlerOptions{ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
		mu.Lock()
		defer mu.Unlock()
		kinds[strings.Join(append(groups, a.Key), ".")] = a.Value.Kind()
		if err, ok := a.Value.Any().(error); ok {
			gotErr = err
		}
		return a
	}})
	tidemarkslog.Logger(slog.New(h)).Warn("kinds",
		zap.Int32("partition", 3), zap.Int64("offset", 10), zap.Uint32("u", 1), zap.Float32("f", 0.5),
		zap.Bool("b", false), zap.Duration("d", time.Second), zap.Time("t", time.Now()), zap.String("s", "x"),
		zap.Error(wrap(sentinel)), zap.Object("obj", point{1, 2}))
	want := map[string]slog.Kind{
		"partition": slog.KindInt64, "offset": slog.KindInt64, "u": slog.KindUint64, "f": slog.KindFloat64,
		"b": slog.KindBool, "d": slog.KindDuration, "t": slog.KindTime, "s": slog.KindString,
		"error": slog.KindAny, "obj.x": slog.KindInt64, "obj.y": slog.KindInt64,
	}
	for k, w := range want {
		if kinds[k] != w {
			t.Errorf("%s: kind %v, want %v", k, kinds[k], w)
		}
	}
	if !errors.Is(gotErr, sentinel) {
		t.Errorf("the error attr holds %v, want the logged error (wrapping the sentinel)", gotErr)
	}
}

func wrap(err error) error { return errors.Join(errors.New("wrapped"), err) }

// zap's levels map to slog's, and the handler's level decides what is
// written: Enabled asks it.
func TestLevels(t *testing.T) {
	for _, tc := range []struct {
		zap  zapcore.Level
		slog slog.Level
		name string
	}{
		{zapcore.DebugLevel, slog.LevelDebug, "DEBUG"},
		{zapcore.InfoLevel, slog.LevelInfo, "INFO"},
		{zapcore.WarnLevel, slog.LevelWarn, "WARN"},
		{zapcore.ErrorLevel, slog.LevelError, "ERROR"},
		{zapcore.DPanicLevel, slog.LevelError + 4, "ERROR+4"},
	} {
		if got := tidemarkslog.Level(tc.zap); got != tc.slog {
			t.Errorf("Level(%v) = %v, want %v", tc.zap, got, tc.slog)
		}
		log, buf := jsonLogger(slog.LevelDebug, false)
		if tc.zap == zapcore.DPanicLevel {
			log = log.WithOptions(zap.WithPanicHook(zapcore.WriteThenNoop)) // zap's DPanic panics only in development
		}
		log.Log(tc.zap, "m")
		if lines := buf.lines(t); len(lines) != 1 || lines[0]["level"] != tc.name {
			t.Errorf("logged at %v: got %v, want one line at level %s", tc.zap, lines, tc.name)
		}
	}

	log, buf := jsonLogger(slog.LevelWarn, false)
	if log.Core().Enabled(zapcore.InfoLevel) || !log.Core().Enabled(zapcore.WarnLevel) {
		t.Errorf("a handler at Warn: Enabled(Info) = %v, Enabled(Warn) = %v; want false, true",
			log.Core().Enabled(zapcore.InfoLevel), log.Core().Enabled(zapcore.WarnLevel))
	}
	if ce := log.Check(zapcore.DebugLevel, "no"); ce != nil {
		t.Errorf("Check at Debug with a handler at Warn returned an entry")
	}
	log.Info("dropped")
	log.Error("kept")
	if lines := buf.lines(t); len(lines) != 1 || lines[0]["msg"] != "kept" {
		t.Errorf("a handler at Warn wrote %v, want only the error", lines)
	}
	if got := log.Level(); got != zapcore.WarnLevel {
		t.Errorf("zap's Level() = %v, want warn", got)
	}
}

// With fields, a namespace (in With and in an entry), the logger's name
// and the caller.
func TestWithNamespaceNameCaller(t *testing.T) {
	log, buf := jsonLogger(slog.LevelInfo, true)
	child := log.Named("tidemark").Named("fetch").With(zap.String("topic", "orders"), zap.Int32("partition", 2))
	child.Info("one", zap.Int64("offset", 5))
	ns := child.With(zap.Namespace("req"), zap.String("id", "r1"))
	ns.Info("two", zap.Int("n", 1), zap.Namespace("inner"), zap.Bool("deep", true))
	lines := buf.lines(t)
	if len(lines) != 2 {
		t.Fatalf("got %d lines, want 2", len(lines))
	}
	one, two := lines[0], lines[1]
	for k, w := range map[string]any{"logger": "tidemark.fetch", "topic": "orders", "partition": json.Number("2"), "offset": json.Number("5")} {
		if !jsonEqual(one[k], w) {
			t.Errorf("first line: %s = %s, want %s", k, js(one[k]), js(w))
		}
	}
	src, _ := one["source"].(map[string]any)
	if file, _ := src["file"].(string); !strings.HasSuffix(file, "core_test.go") {
		t.Errorf("first line's source = %v, want this file (the caller of Info)", one["source"])
	}
	if !jsonEqual(two["topic"], "orders") {
		t.Errorf("second line: topic = %v, want orders (With before the namespace stays outside it)", two["topic"])
	}
	wantReq := map[string]any{"id": "r1", "logger": "tidemark.fetch", "n": json.Number("1"), "inner": map[string]any{"deep": true}}
	if !jsonEqual(two["req"], wantReq) {
		t.Errorf("second line: req = %s, want %s", js(two["req"]), js(wantReq))
	}
}

// A nil logger logs nothing, as a nil Config.Logger does.
func TestNilLogger(t *testing.T) {
	l := tidemarkslog.Logger(nil)
	l.Error("nothing") // must not panic
	if l.Core().Enabled(zapcore.ErrorLevel) {
		t.Error("Logger(nil) is enabled at Error, want a no-op logger")
	}
}
