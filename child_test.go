package tidemark_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/offsetstore"
)

// Child processes: the suite runs this test binary again with
// TIDEMARK_CHILD set, to have a real process to SIGKILL or to hold a lock.
const envChild = "TIDEMARK_CHILD"

// childMain runs the child the environment asks for, and exits; it returns
// false in the test process itself.
func childMain() bool {
	switch os.Getenv(envChild) {
	case "":
		return false
	case "consume":
		os.Exit(childConsume())
	case "lock":
		os.Exit(childLock())
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", envChild, os.Getenv(envChild))
		os.Exit(2)
	}
	return true
}

// childConsume runs a consumer whose handler appends "partition offset" to
// a ledger file, one write(2) per message: what a SIGKILL cannot undo.
// SIGTERM stops it gracefully. With CHILD_CRASH_AT="partition:offset" the
// handler exits the process hard (os.Exit(3): no deferred call, no flush)
// on that message, and the consumer skips what it gives up on, with the
// crash-loop breaker armed at CHILD_CRASH_LIMIT. CHILD_INSTANCE makes it a
// static member with that InstanceID; CHILD_SESSION_TIMEOUT sets its
// SessionTimeout. CHILD_ORDERING ("key", "none"), CHILD_MAX_IN_FLIGHT and
// CHILD_MAX_WINDOW set the concurrency; CHILD_MAX_UNDURABLE sets MaxUndurable; with CHILD_STUCK_AT="partition:offset"
// the handler blocks on that message until its context ends.
func childConsume() int {
	ledger, err := os.OpenFile(os.Getenv("CHILD_LEDGER"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	work, _ := time.ParseDuration(os.Getenv("CHILD_WORK"))
	crashPart, crashOffset := -1, int64(-1)
	if at := os.Getenv("CHILD_CRASH_AT"); at != "" {
		if _, err := fmt.Sscanf(at, "%d:%d", &crashPart, &crashOffset); err != nil {
			fmt.Fprintln(os.Stderr, "CHILD_CRASH_AT:", err)
			return 2
		}
	}
	stuckPart, stuckOffset := -1, int64(-1)
	if at := os.Getenv("CHILD_STUCK_AT"); at != "" {
		if _, err := fmt.Sscanf(at, "%d:%d", &stuckPart, &stuckOffset); err != nil {
			fmt.Fprintln(os.Stderr, "CHILD_STUCK_AT:", err)
			return 2
		}
	}
	limit, _ := strconv.Atoi(os.Getenv("CHILD_CRASH_LIMIT"))
	log, _ := zap.NewDevelopment(zap.IncreaseLevel(zap.WarnLevel))
	cfg := fastConfig(framework.Config{
		Brokers:    strings.Split(os.Getenv("CHILD_BROKERS"), ","),
		GroupID:    os.Getenv("CHILD_GROUP"),
		Topics:     []string{os.Getenv("CHILD_TOPIC")},
		OffsetFile: os.Getenv("CHILD_FILE"),
		Logger:     log,
		Handler: handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
			if work > 0 {
				time.Sleep(work)
			}
			if m.Partition == stuckPart && m.Offset == stuckOffset {
				<-ctx.Done()
				return ctx.Err()
			}
			if m.Partition == crashPart && m.Offset == crashOffset {
				fmt.Fprintf(os.Stderr, "child: exiting hard on %d@%d\n", m.Partition, m.Offset)
				os.Exit(3)
			}
			_, err := fmt.Fprintf(ledger, "%d %d\n", m.Partition, m.Offset)
			return err
		}),
	})
	cfg.InstanceID = os.Getenv("CHILD_INSTANCE")
	switch os.Getenv("CHILD_ORDERING") {
	case "key":
		cfg.Ordering = framework.OrderKey
	case "none":
		cfg.Ordering = framework.OrderNone
	}
	cfg.MaxInFlight, _ = strconv.Atoi(os.Getenv("CHILD_MAX_IN_FLIGHT"))
	cfg.MaxWindow, _ = strconv.Atoi(os.Getenv("CHILD_MAX_WINDOW"))
	cfg.MaxUndurable, _ = strconv.Atoi(os.Getenv("CHILD_MAX_UNDURABLE"))
	if d, err := time.ParseDuration(os.Getenv("CHILD_SESSION_TIMEOUT")); err == nil {
		cfg.SessionTimeout = d
	}
	if crashPart >= 0 {
		cfg.Failure = framework.FailurePolicy{Action: framework.Skip, MaxAttempts: 3}
		cfg.CrashLoopRestarts = limit
	}
	c, err := framework.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := c.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// childLock opens an offset file and holds it until stdin closes.
func childLock() int {
	s, err := offsetstore.Open(os.Getenv("CHILD_FILE"), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("locked")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	_ = s.Close()
	return 0
}

// startConsumeChild starts this test binary as a "consume" child with the
// given CHILD_* settings; it is killed when the test ends if still running,
// and its stderr's tail is logged if the test failed.
func startConsumeChild(t testing.TB, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), envChild+"=consume"), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		if t.Failed() && stderr.Len() > 0 {
			t.Logf("child stderr:\n%s", tail(stderr.String(), 3000))
		}
	})
	return cmd
}
