package testsupport

import (
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"
)

// EnvDebug, set to anything, makes Logger log every level.
const EnvDebug = "TIDEMARK_DEBUG"

// Logger logs warnings and errors to the test's output (every level with
// TIDEMARK_DEBUG set). A log entry that only a bug writes (Bugs) fails
// the test.
func Logger(t testing.TB) *zap.Logger {
	level := zapcore.WarnLevel
	if os.Getenv(EnvDebug) != "" {
		level = zapcore.DebugLevel
	}
	return zaptest.NewLogger(t, zaptest.Level(level), zaptest.WrapOptions(zap.Hooks(func(e zapcore.Entry) error {
		for _, b := range Bugs {
			if strings.HasPrefix(e.Message, b) {
				t.Errorf("a log entry only a bug writes: %q", e.Message)
			}
		}
		return nil
	})))
}

// Bugs are the beginnings of log messages that the library writes only
// when its own bookkeeping is wrong, where production carries on.
var Bugs = []string{
	"progress marker returned invalid completed ranges",
}

// ObservedLogger is Logger teed into an observer that keeps every entry at
// level or above, for the test to assert on.
func ObservedLogger(t testing.TB, level zapcore.Level) (*zap.Logger, *observer.ObservedLogs) {
	core, logs := observer.New(level)
	return zap.New(zapcore.NewTee(Logger(t).Core(), core)), logs
}

// StatusURL waits up to 10s for a consumer with Config.StatusAddr to log
// the address it serves its status page on, and returns the server's base
// URL, "http://host:port". logs must keep info-level entries.
func StatusURL(t testing.TB, logs *observer.ObservedLogs) string {
	t.Helper()
	var base string
	WaitFor(t, 10*time.Second, "the status server's address in the log", func() bool {
		for _, e := range logs.FilterMessage("serving the status page and health checks").All() {
			if a, ok := e.ContextMap()["address"].(string); ok {
				base = "http://" + a
				return true
			}
		}
		return false
	})
	return base
}
