// Package tidemarkslog sends tidemark's logs to a log/slog logger.
//
// Config.Logger takes a *zap.Logger; a service built on log/slog gives it
// one that writes to its own slog handler:
//
//	cfg := framework.Config{
//		// ...
//		Logger: tidemarkslog.Logger(logger), // logger is the service's *slog.Logger
//	}
//
// Each entry becomes a slog.Record: zap's levels map to slog's (Level),
// its fields to attrs of their own kinds (strings, signed and unsigned
// integers, floats, bools, durations, times), an error field stays an
// error, an object (zap.Object, zap.Dict) becomes a group, an array
// (zap.Strings, zap.Array) a []any, and zap.Namespace opens a group
// holding the fields after it. Fields given to With are handed to the
// handler once (slog.Handler.WithAttrs, WithGroup for a namespace). The
// handler decides which entries are written: a zap logger built on it asks
// the handler's Enabled before it builds an entry.
//
// NewCore is the same as a zapcore.Core, to build a logger with options of
// your own or tee it with another core.
//
// # Caveats
//
//   - slog has no logger names: a named zap logger's name is the attr
//     "logger" (NameKey), and a stack trace zap took is "stacktrace"
//     (StacktraceKey). Both come before the entry's fields, so after a
//     zap.Namespace given to With they are inside its group, as the
//     entry's fields are.
//   - Logger records the caller of each entry (zap.AddCaller), so a handler
//     created with slog.HandlerOptions.AddSource shows where tidemark
//     logged. With NewCore the caller is recorded only if the zap logger
//     is built with zap.AddCaller.
//   - Inside an array an object becomes a map[string]any: its keys are
//     written in the handler's order (encoding/json sorts them), not the
//     fields' order.
//   - Complex numbers, which slog has no kind for and encoding/json
//     refuses, are written as strings.
//   - Records are handled with context.Background(): zap passes no context.
//   - Sync does nothing; a handler that buffers is flushed by its owner.
//   - DPanic, Panic and Fatal entries are written at levels above
//     slog.LevelError (Level); what happens after them (a panic, an exit)
//     is still zap's. tidemark logs none of them.
package tidemarkslog
