package framework

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The health checks: liveness (Healthy, /healthz) and readiness (Ready,
// /readyz), and the commit trouble both name without failing for it.

// Healthy is the liveness check: it returns nil while Run runs (or drains
// after its ctx ended), every long-lived loop it owns (the group loop, the
// fetcher, the committer) is alive, and the offset file takes writes.
// Otherwise it returns why not: Run not called or returned, a loop stuck
// in one step for longer than the configured timeouts allow (about three
// minutes with the defaults), or the offset file's last write error
// (Stats.OffsetFileError; the file's writer retries, and Healthy is nil
// again once a write succeeds).
//
// A commit outage (commits to Kafka failing) does not make the consumer
// unhealthy: the offset file keeps the watermarks, handling goes on, and a
// restart would not help. Safe to call from any goroutine, at any time.
func (c *Consumer) Healthy() error {
	err := c.live.running()
	switch {
	case errors.Is(err, errStopping):
		return nil // draining: alive, and about to return
	case err != nil:
		return err
	}
	if err := c.live.stuck(time.Now(), stuckAfter(&c.cfg)); err != nil {
		return err
	}
	if err := c.store.Err(); err != nil {
		return fmt.Errorf("the offset file takes no writes (the writer retries): %w", err)
	}
	return nil
}

// Ready is the readiness check: it returns nil while Run runs, the
// consumer is a member of a generation (Stats.Generation > 0) and every
// partition that generation assigned to it is reconciled (none in
// StateReconciling; revoked partitions do not count). Otherwise it returns
// why not: not running, stopping, joining the group (with the last join's
// error and since when, while joins fail), a subscribed topic that does not
// exist (Stats.MissingTopics, named), a dead-letter topic that takes
// no messages (not checked yet, or its writes failing), or the partitions
// still reconciling. A rebalance that only takes partitions away leaves it
// ready; one that adds partitions makes it unready until they are
// reconciled (a few round trips to Kafka).
//
// A commit outage does not make the consumer unready either (see Healthy);
// StatusHandler's /readyz says so in its body. Safe to call from any
// goroutine, at any time.
func (c *Consumer) Ready() error { return c.ready(c.Stats()) }

func (c *Consumer) ready(s Stats) error {
	if err := c.live.running(); err != nil {
		return err
	}
	if s.Generation <= 0 {
		if s.JoinError != "" {
			return fmt.Errorf("not a member of a generation: joining the group has failed since %s (%s ago, %d attempts): %s",
				s.JoinFailingSince.UTC().Format(time.RFC3339), time.Since(s.JoinFailingSince).Round(time.Second), s.JoinFailures, s.JoinError)
		}
		return errors.New("not a member of a generation: joining the group")
	}
	if len(s.MissingTopics) > 0 {
		return fmt.Errorf("subscribed topic(s) do not exist: %s (consumed once created)", strings.Join(s.MissingTopics, ", "))
	}
	if s.DeadLetterError != "" {
		return fmt.Errorf("%s (since %s, %s ago)", s.DeadLetterError,
			s.DeadLetterErrorSince.UTC().Format(time.RFC3339), time.Since(s.DeadLetterErrorSince).Round(time.Second))
	}
	if c.member.status().settling {
		return fmt.Errorf("generation %d joined; reconciling its assignment", s.Generation)
	}
	var pending []string
	for _, p := range s.Partitions {
		if p.State == StateReconciling {
			pending = append(pending, fmt.Sprintf("%s/%d", p.Topic, p.Partition))
		}
	}
	if len(pending) > 0 {
		return fmt.Errorf("%d assigned partition(s) not reconciled yet: %s", len(pending), clipList(pending, 10))
	}
	return nil
}

// commitTrouble describes a commit outage in s: the owned partitions whose
// last commit failed or had no answer; "" if none.
func commitTrouble(s Stats) string {
	var bad []string
	last := ""
	for _, p := range s.Partitions {
		if p.State == StateRevoked || !commitFailing(p) {
			continue
		}
		bad = append(bad, fmt.Sprintf("%s/%d", p.Topic, p.Partition))
		if last == "" {
			last = p.CommitError
		}
		if last == "" {
			last = "last commit " + p.LastCommit
		}
	}
	if len(bad) == 0 {
		return ""
	}
	return fmt.Sprintf("commits to Kafka failing for %d partition(s) (the offset file keeps the watermarks; "+
		"the committer retries; neither probe fails for it): %s; first error: %s", len(bad), clipList(bad, 8), clipText(last, 300))
}

// clipText cuts s to n runes, marking the cut.
func clipText(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

func commitFailing(p PartitionStats) bool {
	return p.CommitError != "" || p.LastCommit == "error" || p.LastCommit == "unknown"
}

func clipList(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, "; ")
	}
	return strings.Join(s[:n], "; ") + fmt.Sprintf("; and %d more", len(s)-n)
}
