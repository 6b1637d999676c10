package framework

import (
	"context"
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

// logWorthy says whether the nth failure in a row is logged: the first
// three, then every power of two, so that hours of failures are a few
// dozen lines.
func logWorthy(n int) bool { return n <= 3 || n&(n-1) == 0 }

// sleep waits d or until ctx ends, reporting whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
