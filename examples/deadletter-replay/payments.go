package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/handler"
)

// Payments is the service's Handler: it books each payment's amount. Its
// first version has a bug: it parses only amounts written with a decimal
// point, "12.50", and fails on those a legacy producer writes with a
// comma, "12,50". Fixed is the fix being deployed: set, both are parsed.
type Payments struct {
	Fixed atomic.Bool

	mu     sync.Mutex
	booked map[string]int // payment id: times booked
	cents  int64
}

var _ handler.Handler = (*Payments)(nil)

// NewPayments returns the service's Handler, with its bug.
func NewPayments() *Payments { return &Payments{booked: map[string]int{}} }

// Handle books one payment, a value "id=ID amount=UNITS.CENTS".
func (p *Payments) Handle(_ context.Context, m kafka.Message) error {
	id, cents, err := parsePayment(string(m.Value), p.Fixed.Load())
	if err != nil {
		return fmt.Errorf("payment at %s/%d offset %d: %w", m.Topic, m.Partition, m.Offset, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.booked[id]++
	p.cents += cents
	return nil
}

// Booked returns how many times each payment id was booked.
func (p *Payments) Booked() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[string]int, len(p.booked))
	for id, n := range p.booked {
		out[id] = n
	}
	return out
}

// Cents returns the sum booked.
func (p *Payments) Cents() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cents
}

// parsePayment reads "id=ID amount=UNITS.CENTS"; with commaOK (the fix)
// the amount may also be "UNITS,CENTS".
func parsePayment(v string, commaOK bool) (id string, cents int64, err error) {
	var amount string
	for _, f := range strings.Fields(v) {
		switch k, val, _ := strings.Cut(f, "="); k {
		case "id":
			id = val
		case "amount":
			amount = val
		}
	}
	if id == "" {
		return "", 0, fmt.Errorf("no id in %q", v)
	}
	if commaOK {
		amount = strings.Replace(amount, ",", ".", 1)
	}
	units, frac, ok := strings.Cut(amount, ".")
	u, err1 := strconv.ParseInt(units, 10, 64)
	f, err2 := strconv.ParseInt(frac, 10, 64)
	if !ok || len(frac) != 2 || err1 != nil || err2 != nil || u < 0 || f < 0 {
		return "", 0, fmt.Errorf("payment %s: amount %q is not UNITS.CENTS", id, amount)
	}
	return id, u*100 + f, nil
}

// payments returns n payment messages keyed by account; every seventh
// comes from the legacy producer and has a comma in its amount.
func payments(n int) (msgs []kafka.Message, legacy map[string]bool) {
	legacy = map[string]bool{}
	for i := range n {
		id := fmt.Sprintf("pay-%d", i)
		sep := "."
		if i%7 == 3 {
			sep = ","
			legacy[id] = true
		}
		msgs = append(msgs, kafka.Message{
			Key:     fmt.Appendf(nil, "account-%d", i%10),
			Value:   fmt.Appendf(nil, "id=%s amount=%d%s%02d", id, 10+i%90, sep, i%100),
			Headers: []kafka.Header{{Key: "producer", Value: []byte("checkout")}},
		})
	}
	return msgs, legacy
}
