package offsetfile

import (
	"time"

	"go.uber.org/zap"
)

// Options configures Open. A nil *Options means all defaults.
type Options struct {
	// Timeout is how long Open waits for the file lock before failing with
	// an error wrapping ErrInUse. 0 means 1s; the wait is never unbounded.
	Timeout time.Duration

	// NoSync skips fsync after each flush transaction. For benchmarks only:
	// a crash of the machine (not just the process) can then lose or
	// corrupt flushed records, so Durable no longer means durable.
	NoSync bool

	// FlushInterval is the minimum spacing between the starts of two flush
	// transactions. 0 means group commit: the writer flushes as soon as
	// updates are pending, and updates that arrive during a flush go into
	// the next one.
	FlushInterval time.Duration

	// SyncInterval, when positive, makes most flushes cheap: a flush
	// appends the records it changes to a journal beside the file (its
	// path plus JournalSuffix) with one write and no fsync, which
	// survives the process (SIGKILL, OOM) but not a crash of the machine;
	// at most every SyncInterval, on Sync and on Close, a checkpoint
	// writes them into the file in one fsync-ed transaction. Durable then
	// reports what survives the process, Synced what survives the machine.
	// 0 means no journal: every flush is an fsync-ed transaction. Open
	// replays a journal left by a crash whatever this is set to.
	SyncInterval time.Duration

	// ReadOnly opens the file for tools: a shared lock (other read-only
	// opens may share the file, a read-write Open may not), no writer
	// goroutine, and the mutating calls return ErrReadOnly.
	ReadOnly bool

	// KeepFailures bounds the failure entries kept per partition: when a
	// flush writes new entries, the oldest (lowest offsets) beyond the
	// newest KeepFailures are deleted, if they are below the partition's
	// durable watermark. The Skipped and DeadLettered counts keep the
	// totals. 0 means DefaultKeepFailures; negative keeps every entry.
	KeepFailures int

	// OnFlush, if set, is called by the writer goroutine after each flush
	// (a journal write, or a checkpoint transaction with its fsync) with
	// its duration, the records it changed and its error. It must return quickly: the next flush waits for it.
	OnFlush func(d time.Duration, records int, err error)

	// MmapSize is the file's first mapping in bytes (address space, not
	// memory). Below it the file grows without a new mapping, which
	// copies every page a transaction changed to the heap and waits for
	// every read transaction (a TxHandler's runs hold one). 0 means
	// bbolt's default, 32 KiB doubling. Above 16 MiB the file grows in 16
	// MiB steps (sparse where the file system allows), not to what it
	// holds: for files that keep a state, not a few offsets.
	MmapSize int

	// Logger receives flush failures and recoveries. nil means zap.NewNop().
	Logger *zap.Logger
}

const defaultTimeout = time.Second

// DefaultKeepFailures is the default Options.KeepFailures: failure entries
// kept per partition.
const DefaultKeepFailures = 10000

// Retry backoff after a failed flush transaction.
const (
	minBackoff = 10 * time.Millisecond
	maxBackoff = 500 * time.Millisecond
)
