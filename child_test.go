package tidemark_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
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
// SIGTERM stops it gracefully.
func childConsume() int {
	ledger, err := os.OpenFile(os.Getenv("CHILD_LEDGER"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	work, _ := time.ParseDuration(os.Getenv("CHILD_WORK"))
	log, _ := zap.NewDevelopment(zap.IncreaseLevel(zap.WarnLevel))
	c, err := framework.New(fastConfig(framework.Config{
		Brokers:    strings.Split(os.Getenv("CHILD_BROKERS"), ","),
		GroupID:    os.Getenv("CHILD_GROUP"),
		Topics:     []string{os.Getenv("CHILD_TOPIC")},
		OffsetFile: os.Getenv("CHILD_FILE"),
		Logger:     log,
		Handler: handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
			if work > 0 {
				time.Sleep(work)
			}
			_, err := fmt.Fprintf(ledger, "%d %d\n", m.Partition, m.Offset)
			return err
		}),
	}))
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
