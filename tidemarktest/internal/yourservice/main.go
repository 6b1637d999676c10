// Command accounts keeps a running balance per account from a topic of deposits.
package main

import (
	"context"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
)

// Balances is the handler: each message is a deposit, its key the account.
type Balances struct {
	mu  sync.Mutex
	sum map[string]int
}

func (b *Balances) Handle(ctx context.Context, m kafka.Message) error {
	amount, err := strconv.Atoi(string(m.Value))
	if err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sum == nil {
		b.sum = map[string]int{}
	}
	b.sum[string(m.Key)] += amount
	return nil
}

func (b *Balances) Of(account string) int { b.mu.Lock(); defer b.mu.Unlock(); return b.sum[account] }

// Config is the service's consumer, shared by main and the test.
func Config(brokers []string, h *Balances) framework.Config {
	return framework.Config{Brokers: brokers, GroupID: "accounts", Topics: []string{"deposits"},
		OffsetFile: "/var/lib/accounts/offsets.db", Handler: h, Ordering: framework.OrderKey}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := framework.New(Config(strings.Split(os.Getenv("KAFKA_BROKERS"), ","), &Balances{}))
	if err != nil {
		log.Fatal(err)
	}
	if err := c.Run(ctx); err != nil { // returns on SIGTERM, drained and committed
		log.Fatal(err)
	}
}
