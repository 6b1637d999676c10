package tidemarkslog

import (
	"context"
	"log/slog"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Logger returns a *zap.Logger that writes to l's handler, for
// Config.Logger: every entry becomes a slog.Record at the matching level,
// with its fields as attrs of their own types. The logger records the
// caller, so a handler with AddSource shows where tidemark logged. A nil l
// gives a logger that logs nothing, as a nil Config.Logger does.
func Logger(l *slog.Logger) *zap.Logger {
	if l == nil {
		return zap.NewNop()
	}
	return zap.New(NewCore(l.Handler()), zap.AddCaller())
}

// NewCore returns a zapcore.Core that writes each entry to h as a
// slog.Record. Which entries are written is h's choice (h.Enabled, at the
// level Level maps to). Use it to build a *zap.Logger with options of your
// own, or to tee with another core (zapcore.NewTee).
func NewCore(h slog.Handler) zapcore.Core {
	return &core{h: h}
}

// core is immutable: With returns a new one over a new handler, so a core
// is as safe for concurrent use as its handler (slog requires them to be).
type core struct {
	h slog.Handler
}

var _ zapcore.Core = (*core)(nil)

// Level maps a zap level to a slog level: zap's levels are one apart and
// slog's four, from Debug (-1, slog.LevelDebug) through Info, Warn and
// Error (2, slog.LevelError); DPanic, Panic and Fatal continue the scale
// above slog.LevelError, at 12, 16 and 20.
func Level(l zapcore.Level) slog.Level {
	return slog.Level(int(l) * 4)
}

func (c *core) Enabled(l zapcore.Level) bool {
	return c.h.Enabled(context.Background(), Level(l))
}

// With turns fields into the handler's own attrs (WithAttrs), so they are
// converted once, not at every entry. A zap.Namespace among them becomes
// a group (WithGroup) holding the fields after it and those of every
// entry.
func (c *core) With(fields []zapcore.Field) zapcore.Core {
	if len(fields) == 0 {
		return c
	}
	h := c.h
	var enc attrEncoder
	for _, f := range fields {
		if f.Type == zapcore.NamespaceType {
			if attrs := enc.finish(); len(attrs) > 0 {
				h = h.WithAttrs(attrs)
			}
			h = h.WithGroup(f.Key)
			enc = attrEncoder{}
			continue
		}
		addField(&enc, f)
	}
	if attrs := enc.finish(); len(attrs) > 0 {
		h = h.WithAttrs(attrs)
	}
	return &core{h: h}
}

func (c *core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

// Write hands the entry to the handler: its logger name under "logger"
// (slog has no names) and its stack trace, when zap took one, under
// "stacktrace", before its fields.
func (c *core) Write(e zapcore.Entry, fields []zapcore.Field) error {
	var pc uintptr
	if e.Caller.Defined {
		pc = e.Caller.PC
	}
	r := slog.NewRecord(e.Time, Level(e.Level), e.Message, pc)
	var enc attrEncoder
	if e.LoggerName != "" {
		enc.add(slog.String(NameKey, e.LoggerName))
	}
	if e.Stack != "" {
		enc.add(slog.String(StacktraceKey, e.Stack))
	}
	for _, f := range fields {
		addField(&enc, f)
	}
	r.AddAttrs(enc.finish()...)
	return c.h.Handle(context.Background(), r)
}

// Sync does nothing: slog handlers have no flush; one that buffers is
// flushed by its owner.
func (c *core) Sync() error { return nil }

// The keys of what a zap entry carries besides its message and fields,
// as zap's production encoder names them.
const (
	NameKey       = "logger"
	StacktraceKey = "stacktrace"
)
