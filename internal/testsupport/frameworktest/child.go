package frameworktest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// envConsume carries a consume child's settings, as JSON.
const envConsume = "TIDEMARK_CHILD_CONSUME"

// ChildMain is testsupport.ChildMain for a test binary that also runs
// consumer children (StartChild): call it first in TestMain.
func ChildMain() (code int, ok bool) {
	if testsupport.ChildKind() == "consume" {
		return childConsume(), true
	}
	return testsupport.ChildMain()
}

// Child is what a consumer child process does: a Fast consumer of Topic
// whose handler appends "partition offset" to Ledger, one write(2) per
// message (what a SIGKILL cannot undo; testsupport.ReadLedger reads it).
// SIGTERM stops it gracefully; it logs warnings and errors to its standard
// error.
type Child struct {
	Brokers            []string
	Group, Topic, File string
	Ledger             string
	Work               time.Duration // the handler sleeps this long on each message
	InstanceID         string        // Config.InstanceID: a static member
	SessionTimeout     time.Duration // Config.SessionTimeout, if set
	GroupProtocol      string        // Config.GroupProtocol, if set; "consumer": the broker's session and interval
	Ordering           framework.Ordering
	MaxInFlight        int
	MaxWindow          int
	MaxUndurable       int
	// CrashAt, if set, makes the handler exit the process hard on that
	// message (os.Exit(3): no deferred call, no flush), and the consumer
	// skip what it gives up on (three attempts), with the crash-loop
	// breaker armed at CrashLimit (Config.CrashLoopRestarts).
	CrashAt    *testsupport.Offset
	CrashLimit int
	// StuckAt, if set, makes the handler block on that message until its
	// context ends.
	StuckAt *testsupport.Offset
	// State makes the handler a TxHandler that counts each message in its
	// partition's state, under the message's key (StateCount reads a
	// count); the ledger lines are written in the run, before its commit.
	State bool
	// Changelog is the State child's Config.StateChangelog.
	Changelog string
}

// StateCount decodes a count the State child keeps (8 bytes, big endian).
func StateCount(v []byte) uint64 {
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// StartChild starts a consumer child process doing c (see
// testsupport.StartChild: it is killed when the test ends if still
// running).
func StartChild(t testing.TB, c Child) *testsupport.Child {
	t.Helper()
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return testsupport.StartChild(t, "consume", envConsume+"="+string(b))
}

func childConsume() int {
	var c Child
	if err := json.Unmarshal([]byte(os.Getenv(envConsume)), &c); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", envConsume, err)
		return 2
	}
	ledger, err := os.OpenFile(c.Ledger, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	at := func(o *testsupport.Offset, m kafka.Message) bool {
		return o != nil && m.Partition == o.Partition && m.Offset == o.Offset
	}
	log, _ := zap.NewDevelopment(zap.IncreaseLevel(zap.WarnLevel))
	cfg := Fast(framework.Config{
		Brokers:    c.Brokers,
		GroupID:    c.Group,
		Topics:     []string{c.Topic},
		OffsetFile: c.File,
		Logger:     log,
		Handler: handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
			if c.Work > 0 {
				time.Sleep(c.Work)
			}
			if at(c.StuckAt, m) {
				<-ctx.Done()
				return ctx.Err()
			}
			if at(c.CrashAt, m) {
				fmt.Fprintf(os.Stderr, "child: exiting hard on %d@%d\n", m.Partition, m.Offset)
				os.Exit(3)
			}
			_, err := fmt.Fprintf(ledger, "%d %d\n", m.Partition, m.Offset)
			return err
		}),
	})
	if c.State {
		cfg.Handler = nil
		cfg.TxHandler = handler.TxHandlerFunc(func(ctx context.Context, st handler.State, msgs []kafka.Message) error {
			if c.Work > 0 {
				time.Sleep(c.Work * time.Duration(len(msgs)))
			}
			var lines []byte
			for _, m := range msgs {
				v, err := st.Get(m.Key)
				if err != nil {
					return err
				}
				if err := st.Put(m.Key, binary.BigEndian.AppendUint64(nil, StateCount(v)+1)); err != nil {
					return err
				}
				lines = fmt.Appendf(lines, "%d %d\n", m.Partition, m.Offset)
			}
			_, err := ledger.Write(lines)
			return err
		})
	}
	cfg.InstanceID = c.InstanceID
	cfg.StateChangelog = c.Changelog
	cfg.Ordering = c.Ordering
	cfg.MaxInFlight, cfg.MaxWindow, cfg.MaxUndurable = c.MaxInFlight, c.MaxWindow, c.MaxUndurable
	if c.SessionTimeout > 0 {
		cfg.SessionTimeout = c.SessionTimeout
	}
	if c.GroupProtocol != "" {
		cfg.GroupProtocol = c.GroupProtocol
	}
	if cfg.GroupProtocol == framework.GroupProtocolConsumer {
		cfg.SessionTimeout, cfg.HeartbeatInterval = 0, 0
	}
	if c.CrashAt != nil {
		cfg.Failure = framework.FailurePolicy{Action: framework.Skip, MaxAttempts: 3}
		cfg.CrashLoopRestarts = c.CrashLimit
	}
	cons, err := framework.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := cons.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
