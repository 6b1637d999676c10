package framework

import (
	"context"
	"fmt"
	"strconv"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

// State: a TxHandler's runs, and what the consumer shows of the state.
//
// txRuns makes a TxHandler one more BatchHandler of the engine: each call
// is one run, on the partition's goroutine, whose state changes and new
// watermark are queued together for one transaction
// (offsetfile.StateTx.Commit) before it returns nil. The dispatcher, the
// failure policies and the crash-loop breaker handle it as any batch: a
// failed run is split in halves, each its own run, down to the failing
// message. The tracker then
// marks the run done; the watermark it writes is the one queued with the
// run's changes, and any write of the file that carries it carries them
// (a checkpoint, as the writer never journals while runs are queued).
type txRuns struct {
	h     handler.TxHandler
	store *offsetfile.Store
	group string
	ident *identity
	// logged: a changelog (Config.StateChangelog) sends each run's
	// changes from the file's outbox.
	logged bool
}

func (r *txRuns) HandleBatch(ctx context.Context, msgs []kafka.Message) error {
	first := msgs[0]
	k := storeKey(r.group, topicPartition{first.Topic, int32(first.Partition)})
	st, err := r.store.BeginState(k)
	if err != nil {
		return err
	}
	defer st.Discard() // an error or a panic drops the run's changes
	if err := r.h.HandleTx(ctx, st, msgs); err != nil {
		return err
	}
	if r.logged {
		st.LogChanges(first.Offset)
	}
	gen, member := r.ident.get()
	if err := st.Commit(ctx, msgs[len(msgs)-1].Offset+1, gen, member); err != nil {
		return fmt.Errorf("committing the state of %s/%d at offsets %d-%d: %w", first.Topic, first.Partition,
			first.Offset, msgs[len(msgs)-1].Offset, err)
	}
	return nil
}

// ViewState calls fn with the state of topic's partition as the offset file
// holds it: read-only (Put and Delete fail), consistent (one read
// transaction), as of the file's last checkpoint (runs are written within
// FlushInterval of their end). It may be called while Run runs, from any
// goroutine; fn must not keep st or its values.
func (c *Consumer) ViewState(topic string, partition int, fn func(st handler.State) error) error {
	k := storeKey(c.cfg.GroupID, topicPartition{topic, int32(partition)})
	return c.store.ViewState(k, func(st *offsetfile.StateTx) error { return fn(st) })
}

// stateMmapSize is the offset file's first mapping for cfg: 1 GiB with a
// TxHandler on a 64-bit machine, whose file holds a state that grows
// (offsetfile.Options.MmapSize), bbolt's default otherwise. A restore
// into a file remapped at each doubling took half again as long.
func stateMmapSize(cfg Config) int {
	if cfg.TxHandler == nil || strconv.IntSize < 64 {
		return 0
	}
	return 1 << 30
}
