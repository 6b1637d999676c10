package framework

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/tidemark/tidemark/internal/offsetfile"
	"go.uber.org/zap"
)

// The partition callbacks, Config.OnAssigned and Config.OnRevoked: the
// partition's goroutine calls OnAssigned when its run starts, before it
// fetches (partition.run); the revoke calls OnRevoked between the drain's
// flush and the final commit (assignment.stop). Their contract is written
// in Config and docs/handler.md.

// assigned calls Config.OnAssigned for p, again after each error with the
// capped backoff of Handler retries (the partition reconciling, the error
// in Stats), until it returns nil or ctx (the run) ends. It reports
// whether the run may go on; if not, the run is over: done is closed.
func (p *partition) assigned(ctx context.Context) bool {
	cfg := p.env.cfg
	if cfg.OnAssigned == nil {
		p.onAssigned.Store(true)
		return true
	}
	topic, partition := p.tp.topic, int(p.tp.partition)
	bo := newBackoff(cfg.RetryBackoff, cfg.MaxRetryBackoff)
	for ctx.Err() == nil { // not called for a run revoked before it began
		err := callback(cfg, p.logger(), "OnAssigned", p.tp, func() error { return cfg.OnAssigned(ctx, topic, partition) })
		if err == nil {
			if bo.n > 0 {
				p.logger().Info("OnAssigned succeeded; the partition starts", zap.Int("failed_attempts", bo.n))
			}
			p.onAssigned.Store(true)
			return true
		}
		if ctx.Err() != nil {
			break // revoked meanwhile: the error is the revoke's
		}
		p.st.setError(err)
		d := bo.next()
		if logWorthy(bo.n) {
			p.logger().Warn("OnAssigned failed; the partition waits and it is called again", zap.Int("attempts", bo.n),
				zap.Duration("backoff", d), zap.Error(err))
		}
		if !sleep(ctx, d) {
			break
		}
	}
	// Revoked first: the run ends cleanly (the crash-loop breaker must not
	// count it), unless the revoke stopped waiting for the callback.
	if !p.abandoned.Load() {
		if err := p.env.store.SetRun(p.key, offsetfile.RunState{Inflight: -1}); err != nil {
			p.logger().Error("recording the run state failed", zap.Error(err))
		}
	}
	close(p.done)
	return false
}

// revoked calls Config.OnRevoked for each of parts whose OnAssigned
// returned nil and whose run ended (not abandoned), one at a time, with
// one context for all that ends DrainTimeout after the first call.
func (a *assignment) revoked(parts []*partition, lost bool) {
	f := a.cfg.OnRevoked
	if f == nil {
		return
	}
	ctx, cancel := context.WithTimeout(a.env.handlerCtx, a.cfg.DrainTimeout)
	defer cancel()
	for _, p := range parts {
		if !p.onAssigned.Load() || p.abandoned.Load() {
			continue
		}
		topic, partition := p.tp.topic, int(p.tp.partition)
		// A panic is logged by callback; the revoke goes on.
		_ = callback(a.cfg, a.log, "OnRevoked", p.tp, func() error { f(ctx, topic, partition, lost); return nil })
		a.watch.busy() // liveness: each call is a step
	}
}

// callback calls fn, the callback name of tp, and turns a panic into an
// error (its stack logged), unless Config.DisableRecover.
func callback(cfg *Config, log *zap.Logger, name string, tp topicPartition, fn func() error) (err error) {
	if !cfg.DisableRecover {
		defer func() {
			if v := recover(); v != nil {
				err = fmt.Errorf("tidemark: %s panicked for %s/%d: %v", name, tp.topic, tp.partition, v)
				if cause, ok := v.(error); ok {
					err = fmt.Errorf("tidemark: %s panicked for %s/%d: %w", name, tp.topic, tp.partition, cause)
				}
				log.Error("a partition callback panicked", zap.String("callback", name), zap.String("topic", tp.topic),
					zap.Int32("partition", tp.partition), zap.Any("value", v), zap.ByteString("stack", debug.Stack()))
			}
		}()
	}
	if err := fn(); err != nil {
		return fmt.Errorf("tidemark: %s of %s/%d: %w", name, tp.topic, tp.partition, err)
	}
	return nil
}
