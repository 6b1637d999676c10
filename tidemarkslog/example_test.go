package tidemarkslog_test

import (
	"log/slog"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/tidemark/tidemark/tidemarkslog"
)

// A service's slog logger, given to tidemark as a *zap.Logger: set
// framework.Config.Logger to tidemarkslog.Logger(logger). Here the logger
// the Consumer would get logs a line of the kind it writes.
func Example() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{} // a stable output for the example
			}
			return a
		},
	}))

	log := tidemarkslog.Logger(logger) // framework.Config{Logger: log, ...}

	log.Named("tidemark").With(zap.String("group", "billing")).Warn("handler still running after DrainTimeout; cancelling its context",
		zap.String("topic", "orders"), zap.Int32("partition", 3), zap.Duration("drain_timeout", 5*time.Second))
	log.Debug("not written: the handler's level is Info")
	// Output:
	// level=WARN msg="handler still running after DrainTimeout; cancelling its context" group=billing logger=tidemark topic=orders partition=3 drain_timeout=5s
}
