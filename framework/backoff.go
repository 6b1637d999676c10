package framework

import (
	"math/rand/v2"
	"time"
)

// backoff is the one retry schedule of the consumer: capped exponential,
// with jitter, so that the retries of many partitions or processes after a
// broker restart do not arrive in lockstep. Each retrying loop owns its own
// backoff; it is not safe for concurrent use.
type backoff struct {
	base, max time.Duration
	n         int // failures in a row
}

func newBackoff(base, max time.Duration) backoff { return backoff{base: base, max: max} }

// next counts a failure and returns how long to wait before the next try:
// between half and all of base·2^(n-1), capped at max.
func (b *backoff) next() time.Duration {
	b.n++
	d := b.base
	for i := 1; i < b.n && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// reset forgets the failures: the next wait is short again.
func (b *backoff) reset() { b.n = 0 }
