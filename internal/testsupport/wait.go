package testsupport

import (
	"errors"
	"testing"
	"time"
)

// pollEvery is how often WaitFor and WaitForNoError look again.
const pollEvery = 20 * time.Millisecond

// WaitFor polls cond until it holds, and fails the test (t.Fatalf) naming
// what it waited for if timeout passes first. cond runs on the test's
// goroutine, so it may call t.Fatal itself.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := poll(timeout, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}); err != nil {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// WaitForNoError is WaitFor for a step that fails for a while: it calls fn
// until fn returns nil, and fails the test with fn's last error if timeout
// passes first.
func WaitForNoError(t testing.TB, timeout time.Duration, what string, fn func() error) {
	t.Helper()
	if err := poll(timeout, fn); err != nil {
		t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
	}
}

var errNotYet = errors.New("not yet")

// poll calls fn every pollEvery until it returns nil or timeout passes; it
// returns fn's last error.
func poll(timeout time.Duration, fn func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := fn()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(pollEvery)
	}
}
