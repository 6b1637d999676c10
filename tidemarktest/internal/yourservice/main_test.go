package main

import (
	"fmt"
	"testing"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/tidemarktest"
)

func TestBalances(t *testing.T) {
	b := tidemarktest.NewBroker(t) // in-process, or KAFKA_BROKERS
	topic := b.CreateTopic(t, "deposits", 3)
	var deposits []kafka.Message
	for i := range 300 { // 10 accounts, 30 deposits of 5 each
		deposits = append(deposits, kafka.Message{Key: fmt.Appendf(nil, "acct-%d", i%10), Value: []byte("5")})
	}
	msgs := b.Produce(t, topic, deposits...)

	balances := &Balances{}
	rec := tidemarktest.NewRecorder(balances)
	cfg := Config(b.Brokers(), balances)
	cfg.Topics, cfg.Handler, cfg.GroupID, cfg.OffsetFile = []string{topic}, rec, "", "" // Run picks a group and a file
	tidemarktest.Run(t, cfg, tidemarktest.Processed(msgs))

	if err := rec.Check(msgs); err != nil { // none lost, none twice, each account in order
		t.Fatal(err)
	}
	if got := balances.Of("acct-3"); got != 150 {
		t.Errorf("acct-3 = %d, want 150", got)
	}
}
