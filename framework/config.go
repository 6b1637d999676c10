package framework

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/offsetfile"
)

// OutOfRangePolicy says what a partition does when the offset it should
// resume at is outside the log: below the log start (retention deleted the
// messages) or beyond the log end (the topic was recreated, or the offset
// file was copied from another cluster).
type OutOfRangePolicy int

const (
	// ResetToEarliest resumes at the log start, logs the reset at error
	// level with both offsets, and records it in the offset file. The
	// default: messages that still exist are never skipped silently.
	ResetToEarliest OutOfRangePolicy = iota
	// ResetToLatest resumes at the log end, logged and recorded like
	// ResetToEarliest. Messages between the two are not handled.
	ResetToLatest
	// Stall stops the partition, visibly in Stats and the log, until an
	// operator repairs the offset file or Kafka's committed offset and the
	// partition is reassigned.
	Stall
)

func (p OutOfRangePolicy) String() string {
	switch p {
	case ResetToEarliest:
		return "reset-to-earliest"
	case ResetToLatest:
		return "reset-to-latest"
	case Stall:
		return "stall"
	}
	return fmt.Sprintf("OutOfRangePolicy(%d)", int(p))
}

// Ordering says which messages of a partition may be handled concurrently
// (Config.Ordering). The package handler's documentation states the order
// each one guarantees.
type Ordering int

const (
	// OrderPartition handles a partition's messages one at a time, in
	// offset order. The default.
	OrderPartition Ordering = iota
	// OrderKey handles messages with the same key one at a time, in offset
	// order, and messages with different keys concurrently. A message with
	// a nil key is ordered with nothing.
	OrderKey
	// OrderNone handles any of a partition's messages concurrently.
	OrderNone
)

func (o Ordering) String() string {
	switch o {
	case OrderPartition:
		return "partition"
	case OrderKey:
		return "key"
	case OrderNone:
		return "none"
	}
	return fmt.Sprintf("Ordering(%d)", int(o))
}

// FailureAction is what a failure policy does with a message once its
// Handler calls failed MaxAttempts times, or once the crash-loop breaker
// named it. It is offsetstore's type: the failure entries in the offset
// file (offsetfile.Failure.Action) record Skip and DeadLetter in it.
type FailureAction = offsetfile.FailureAction

const (
	// Retry retries the message forever, with capped exponential backoff:
	// the partition never moves past it. The default. When the crash-loop
	// breaker trips under this action, the partition stops (as with Stop)
	// instead of crashing the process again.
	Retry FailureAction = offsetfile.FailureRetry
	// DeadLetter writes the message (key, value, headers) to
	// FailurePolicy.DeadLetterTopic with headers describing the failure, and
	// marks it done only after the broker acknowledged the write. While the
	// dead-letter topic cannot be written, the partition waits and retries:
	// nothing is skipped.
	DeadLetter FailureAction = offsetfile.FailureDeadLetter
	// Skip records the offset, reason and time in the offset file (see
	// offsetfile.Store.Failures), counts it, and moves on.
	Skip FailureAction = offsetfile.FailureSkip
	// Stop holds the message, visibly in Stats and the log, until
	// Consumer.Resume is called (it is then tried again from its first
	// attempt) or the partition is reassigned. With OrderPartition that
	// stalls the partition; with OrderKey it holds the message's key, with
	// OrderNone the message alone, while the others go on within MaxWindow.
	Stop FailureAction = offsetfile.FailureStop
)

// FailurePolicy says what happens to a message whose Handler keeps failing.
// The zero value retries forever.
type FailurePolicy struct {
	// Action applies after MaxAttempts failed Handler calls.
	Action FailureAction
	// MaxAttempts is the number of Handler calls before Action, with
	// RetryBackoff..MaxRetryBackoff between them. Default 5; must be 0
	// with Retry.
	MaxAttempts int
	// DeadLetterTopic receives the messages given up on with DeadLetter.
	// Required with DeadLetter, ignored otherwise; it must exist and must
	// not be one of the consumed Topics.
	DeadLetterTopic string
}

func (fp FailurePolicy) String() string {
	switch fp.Action {
	case Retry:
		return "retry forever"
	case DeadLetter:
		return fmt.Sprintf("dead-letter to %q after %d attempts", fp.DeadLetterTopic, fp.MaxAttempts)
	}
	return fmt.Sprintf("%s after %d attempts", fp.Action, fp.MaxAttempts)
}

// Config configures a Consumer. The zero value of every optional field
// selects the default named in its comment.
type Config struct {
	// Brokers are the bootstrap addresses, "host:port". Required.
	Brokers []string
	// GroupID is the Kafka consumer group. Required.
	GroupID string
	// Topics to consume. Required; no duplicates. One that does not exist
	// is warned about, named in Ready and Stats.MissingTopics, and consumed
	// once created (within the 5 s partition watch).
	Topics []string
	// OffsetFile is the path of the local bbolt file that records processed
	// offsets: the source of truth. It is created with mode 0600 if missing;
	// its folder must exist. Only one process may use it at a time.
	// Required.
	OffsetFile string
	// Handler is called for every message. Required, unless BatchHandler
	// is set instead. It is wrapped in handler.Recover unless DisableRecover
	// is set.
	Handler handler.Handler
	// BatchHandler, set instead of Handler, is called with runs of up to
	// BatchSize messages (see the package handler's contract). It is wrapped
	// in handler.RecoverBatch unless DisableRecover is set.
	BatchHandler handler.BatchHandler
	// TxHandler, set instead of Handler or BatchHandler, applies runs of up
	// to BatchSize messages of a partition to the partition's state, kept in
	// the offset file: once HandleTx returns nil, a run's changes and the
	// partition's new watermark are queued together and written in one
	// fsync-ed transaction (the next checkpoint, within FlushInterval), so
	// each message's effect is in the state exactly once whatever crashes (see
	// docs/state.md). An error drops the run's changes, and the run is split
	// as a BatchHandler's is to find the failing message, on which the
	// failure policy acts; a skipped or dead-lettered message changes
	// nothing (the dead-letter write itself is at-least-once). It requires
	// OrderPartition. Without a changelog the state is this file's only: a
	// partition that Kafka's committed offset shows handled elsewhere (or
	// reset) stalls with an error rather than go on with a state that
	// misses messages, unless StateRebuild is set. Read the state with
	// Consumer.ViewState.
	TxHandler handler.TxHandler
	// StateChangelog, with a TxHandler, is the suffix of the changelog
	// topics: the changes of consumed topic T's partition P are written
	// to partition P of topic T+StateChangelog (e.g. "-state"), so that
	// the state follows its partition to another member, which restores
	// it from there. Run checks each changelog before it joins: a missing
	// one is created (compacted, with T's partition count); one with
	// another partition count or not compacted (cleanup.policy other than
	// "compact") ends Run with an error naming it. Kafka's committed offset
	// of P never passes the changes the changelog acknowledged. A
	// changelog holds one group's changes: a partition whose changelog
	// holds another group's marker stalls with ErrChangelogOtherGroup;
	// give each group consuming T a suffix of its own (e.g. "-" + GroupID
	// + "-state"). Default "" (no
	// changelog: the state is this file's only). See docs/state.md.
	StateChangelog string
	// StateRebuild, with a TxHandler and no StateChangelog, rebuilds a
	// partition whose state the file cannot vouch for (Kafka's committed
	// offset shows it handled elsewhere, as on a new host) instead of
	// stalling it: the partition's state is emptied and its messages are
	// handled again from the log's first offset, and Kafka's committed
	// offset is left where it is until the rebuild passes it. The rebuilt
	// state is that of the messages the log still holds: records that
	// retention deleted are missing from it (a warning says so). A reset
	// by OutOfRange still stalls. Default false: stall with an error.
	StateRebuild bool
	// BatchSize is the most messages in one BatchHandler call or TxHandler
	// run. Default 100.
	// BatchLinger is how long a batch smaller than BatchSize waits for more
	// messages before it is handled. Default 0: a batch is what is already
	// fetched, ready and in order.
	BatchSize   int
	BatchLinger time.Duration
	// DisableRecover leaves panics in Handler unrecovered: they crash the
	// process, as they would in a plain goroutine.
	DisableRecover bool

	// OnAssigned, when set, is called for each partition this consumer is
	// given, on the partition's own goroutine (the calls of several
	// partitions run concurrently), after reconciliation decided where it
	// resumes and recorded it in the offset file, and before any of
	// its messages is fetched or handled: load what handling the partition
	// needs there. A slow call delays that partition alone. An error (or a
	// panic, recovered unless DisableRecover) leaves the partition
	// reconciling, its error in Stats' LastError and the log, and it is
	// called again after RetryBackoff..MaxRetryBackoff, until it returns
	// nil or the partition is revoked. ctx ends when the partition is
	// revoked or Run stops; a call that ignores it is abandoned after
	// DrainTimeout, as a Handler call is. See docs/handler.md.
	OnAssigned func(ctx context.Context, topic string, partition int) error
	// OnRevoked, when set, is called once for each partition whose
	// OnAssigned returned nil, when the partition leaves this consumer (a
	// rebalance, Run's stop, a lapse): on the goroutine that revokes, one
	// partition after another, after the partition's drain (its Handler
	// calls returned) and the offset file's flush, and before the final
	// commit of its watermark, which only then can reach Kafka: flush what
	// was handled there. lost reports that no final commit follows (the
	// membership lapsed or was fenced, or Run stops on an error): the
	// partition may be someone else's already, and its next owner handles
	// again what was handled since the last commit. A slow call delays the
	// revoke's final commit, and so the rebalance or Run's return; ctx,
	// one for the revoke's calls, ends DrainTimeout after the first call
	// began. A
	// panic is recovered (unless DisableRecover) and logged. It is not
	// called for a partition whose Handler call the revoke abandoned: that
	// call may still use what OnAssigned set up. See docs/handler.md.
	OnRevoked func(ctx context.Context, topic string, partition int, lost bool)

	// Ordering says which messages of a partition may be handled
	// concurrently: OrderPartition (default), OrderKey or OrderNone.
	Ordering Ordering
	// MaxInFlight is the most Handler (or BatchHandler) calls at once per
	// partition. It must be 1 with OrderPartition (the default there);
	// default 100 with OrderKey and OrderNone.
	MaxInFlight int
	// MaxWindow bounds the messages a partition holds at or above its
	// watermark: in a call, waiting for their key, or completed above an
	// older message still in a call. The completed ones are recorded in the
	// offset file, so a restart never handles them again. When a partition
	// reaches MaxWindow (one key stuck in a slow or failing call) it stops
	// taking messages until the oldest completes, and Stats shows
	// WindowFull. Default 10,000.
	MaxWindow int

	// Logger receives the consumer's logs, and kafka-go's. Nil means no
	// logging.
	Logger *zap.Logger

	// CommitInterval is how often the offset file is synced (a checkpoint,
	// see SyncInterval) and its watermarks committed to Kafka, in the
	// background. Default 1s.
	CommitInterval time.Duration
	// OnCommit, when set, is told about each commit of offsets to Kafka
	// (see CommitEvent) once Kafka answered or the commit failed, for
	// tracing (plugin/tidemarkotel) or logging. It runs on the goroutine
	// that committed, while no other commit can start: it must return
	// quickly and must not panic. Default nil.
	OnCommit func(CommitEvent)
	// FlushInterval is the least time between two fsync-ed writes of the
	// offset file; each write folds every update since the last one, for
	// all partitions. Default 5ms: at moderate rates an fsync per message
	// costs more CPU than the rest of the consumer, and 5 ms more between
	// handling and durability only widens what a SIGKILL makes handled again
	// by what was handled in those 5 ms: a message is durable within the
	// longer of FlushInterval and one flush, plus one flush (one running when
	// it was handled finishes first). Negative: write as soon as updates
	// are pending (group commit; the widest fsync rate the disk allows).
	FlushInterval time.Duration
	// SyncInterval is the most time between two fsyncs of the offset file.
	// In between, each write (every FlushInterval) goes to a journal beside
	// the file with no fsync: it survives the process (SIGKILL, OOM), which
	// is what FlushInterval and MaxUndurable bound, but not a crash of the
	// machine, whose next run handles again what was handled since the
	// last fsync: at most SyncInterval plus one flush. Offsets reach Kafka
	// only once fsync-ed, so a crash of the machine never leaves Kafka
	// ahead of the file. A graceful hand-off (revoke, Close) fsyncs first.
	// Default 1s: at moderate rates an fsync every FlushInterval costs more
	// CPU than handling. Negative: no journal, every write fsync-ed (the
	// behaviour before SyncInterval existed).
	SyncInterval time.Duration
	// MaxUndurable bounds, per partition, the messages handled and not yet
	// durable in the offset file: what a SIGKILL makes this consumer handle
	// again. At the bound the partition waits for the file (Stats shows
	// DurableWait), so a disk that stops taking writes (full, failing) stops
	// handling instead of letting the window grow; it resumes once a write
	// succeeds. 1 makes each message durable before the next one of its
	// partition is handled, like a synchronous commit, while the fsyncs
	// still group the partitions together. With OrderKey and OrderNone,
	// where offsets complete out of order, it bounds the messages the file
	// does not prove done: in a call, waiting for their key, or done since
	// the last flush; a call that holds (a stuck key, Stop) takes one of
	// them, so a bound below MaxInFlight limits the calls. Either way a
	// SIGKILL makes the next run handle again at most MaxUndurable
	// messages per partition (TestBoundedReplay, TestBoundedReplayOutOfOrder).
	// Default 100,000.
	MaxUndurable int
	// NoSync skips fsync on the offset file. For benchmarks only: a crash of
	// the machine (not just the process) may then lose recorded offsets.
	NoSync bool
	// StartOffset is where a partition starts when neither the offset file
	// nor Kafka knows a position: kafka.FirstOffset (default) or
	// kafka.LastOffset. LastOffset applies to the partitions that existed
	// when the consumer started (its first metadata read): one that appears
	// later (partitions added, a subscribed topic created) starts at its
	// first offset, so that what was produced to it before the group
	// assigned it is not skipped (Java's consumer and franz-go skip it).
	StartOffset int64
	// OutOfRange is the policy for a position outside the log. Default
	// ResetToEarliest.
	OutOfRange OutOfRangePolicy
	// IsolationLevel is which records of transactional producers are
	// handled. kafka.ReadUncommitted (the default, as kafka-go's Reader)
	// hands out every record as soon as it is written, including those of
	// transactions that are later aborted. kafka.ReadCommitted hands out
	// only the records of committed transactions, and those of
	// non-transactional producers, once every transaction before them is
	// decided: nothing at or above the last stable offset (LSO), so an open
	// transaction holds its partition back until it ends, and lag is
	// measured against the LSO. Control records (transaction markers) are
	// never handed out, at either level.
	IsolationLevel kafka.IsolationLevel

	// DrainTimeout bounds how long a revoked or stopping partition waits for
	// the Handler call in flight before cancelling its context. It must stay
	// below RebalanceTimeout minus HeartbeatInterval so that the final commit
	// lands before the group moves on: that commit is retried, while it
	// fails with a retriable error, until RebalanceTimeout minus
	// HeartbeatInterval has passed since the revoke began, or DrainTimeout
	// at a graceful stop (see Stats.RevokedUncommitted). Default 5s.
	DrainTimeout time.Duration
	// RetryBackoff and MaxRetryBackoff bound the capped exponential backoff
	// between attempts of a message whose Handler call failed, and between
	// dead-letter writes. Each wait is jittered, between half and all of
	// its step. Defaults 100ms and 10s.
	RetryBackoff    time.Duration
	MaxRetryBackoff time.Duration

	// Failure is the failure policy of every topic without an entry in
	// TopicFailure. The zero value retries forever and never skips.
	Failure FailurePolicy
	// TopicFailure overrides Failure per topic.
	TopicFailure map[string]FailurePolicy
	// CrashLoopRestarts arms the crash-loop breaker: after this many unclean
	// restarts in a row (crash, SIGKILL, OOM) that each began with the same
	// message in flight, that message goes to its topic's failure policy
	// without another Handler call (Retry becomes Stop). Default 3;
	// negative disables the breaker.
	CrashLoopRestarts int

	// Group membership. SessionTimeout: how long the coordinator keeps a
	// member that stopped heartbeating; HeartbeatInterval: how often this
	// member heartbeats (and so how soon it notices a rebalance);
	// RebalanceTimeout: how long a rebalance waits for the members to
	// rejoin; JoinGroupBackoff: the base of the jittered backoff between
	// failed joins. Defaults 10s, 3s, 30s, 2s.
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	RebalanceTimeout  time.Duration
	JoinGroupBackoff  time.Duration
	// InstanceID makes this consumer a static member of the group
	// (KIP-345): a restart with the same id within SessionTimeout gets its
	// partitions back without a rebalance of the others, and a graceful stop
	// does not leave the group (unless LeaveOnClose). Give each process of
	// the group its own id, stable across its restarts (a pod name); a
	// second live process with the same id fences the first, whose Run
	// returns ErrFencedInstance. Empty (default): a dynamic member.
	InstanceID string
	// LeaveOnClose makes a static member leave the group when Run returns,
	// so that the others rebalance at once. Dynamic members always leave.
	LeaveOnClose bool
	// GroupProtocol is the group protocol, named as the Java client's
	// group.protocol: "classic" (default) is JoinGroup and SyncGroup, the
	// assignment computed here by the group's leader (cooperative-sticky);
	// "consumer" is Kafka 4's consumer group protocol (KIP-848, Kafka 4.0
	// and later): the coordinator assigns, each member heartbeats what it
	// owns, and a rebalance never waits for another member. With
	// "consumer", SessionTimeout and HeartbeatInterval are the broker's
	// (group.consumer.session.timeout.ms, group.consumer.heartbeat.interval.ms)
	// and setting either is refused by New; RebalanceTimeout bounds a
	// member's revocation, as in the classic protocol. See
	// docs/membership.md for when to choose which.
	GroupProtocol string
	// GroupRemoteAssignor names the coordinator's assignor for
	// GroupProtocol "consumer" ("uniform", "range", or one the broker's
	// group.consumer.assignors lists); empty (default): the broker's first.
	// Refused with the classic protocol, whose assignor runs here.
	GroupRemoteAssignor string

	// FetchMaxWait is how long a fetch waits on the broker for new messages.
	// Default 500ms. FetchMaxBytes bounds what one fetch asks for one
	// partition. Default 1 MiB.
	FetchMaxWait  time.Duration
	FetchMaxBytes int
	// MetadataMaxAge is how often the consumed topics' metadata is read
	// again when nothing failed. A leader that moves without a refused
	// fetch is found then: a Kafka node shutting down cleanly hands its
	// partitions on first and keeps answering fetches for them, with
	// nothing, until its process exits a second or two later. Default 5m,
	// as Java's metadata.max.age.ms and franz-go's MetadataMaxAge; a
	// rolling restart resumes within about MetadataMaxAge of each move, at
	// the cost of one Metadata request per MetadataMaxAge.
	MetadataMaxAge time.Duration
	// MaxBufferedBytes bounds the fetched and decompressed but not yet
	// handled bytes across all partitions. It can be passed by one batch
	// per broker (a broker returns a partition's first batch whole), and,
	// so that partitions holding batches in slow handlers never stop the
	// others, by each partition's one decompressed batch within its share
	// of the budget: twice the budget at worst. A batch that decompresses
	// to more than it stalls its partition with an error naming it.
	// Default 16 MiB: a MiB of it costs about two of peak RSS (the heap
	// grows to twice what is live before a GC), and 32 MiB was no faster
	// in the runs measured (docs/operations.md).
	MaxBufferedBytes int
	// Timeout bounds each request to the brokers (commits, offsets,
	// coordinator). Default 10s.
	Timeout time.Duration

	// ClientID names this client to the brokers. Default "tidemark".
	ClientID string
	// TLS and SASL, when set, are used for every connection to a broker
	// (fetches, group membership, offsets, dead letters). SASL takes
	// kafka-go's mechanisms (sasl/plain, sasl/scram).
	TLS  *tls.Config
	SASL sasl.Mechanism

	// InspectSocket is where Run serves a read-only snapshot of the offset
	// file and Stats for the tidemark command's read commands (inspect,
	// diff, export, serve; docs/command.md), which cannot open a file a
	// running consumer holds: "" (default) a unix socket at
	// OffsetFile+".sock" (loopback TCP where that is not possible), a unix
	// socket path, "tcp:127.0.0.1:PORT", or "-" to serve nothing. The
	// address is published in OffsetFile+".inspect" with an access token,
	// mode 0600: only a user who can read that file can read the snapshot.
	InspectSocket string

	// StatusAddr, when set, is where Run serves StatusHandler over HTTP
	// (the status page, /healthz, /readyz, /status.json and /metrics; see
	// StatusHandler): "host:port". Loopback unless told otherwise: a host-less
	// ":9464" listens on 127.0.0.1:9464, while "0.0.0.0:9464" or
	// "[::]:9464" listens on every interface (as a Kubernetes probe needs).
	// Port 0 picks a free port, logged. Run stops the server before it
	// returns, and returns at once with an error if it cannot listen.
	// Default "": no server (StatusHandler can be mounted on one of yours).
	StatusAddr string
	// MetricsHandler, when set, makes the handler StatusHandler serves at
	// /metrics (metrics.Handler fits); it is called once, with the
	// Consumer, the first time StatusHandler is. Default nil: /metrics is
	// 404.
	MetricsHandler func(*Consumer) http.Handler
}

// The values of Config.GroupProtocol.
const (
	GroupProtocolClassic  = "classic"  // JoinGroup, SyncGroup, Heartbeat: tidemark's cooperative-sticky membership
	GroupProtocolConsumer = "consumer" // ConsumerGroupHeartbeat (KIP-848): the broker assigns
)

// ConfigError reports an invalid Config field. New returns all of them
// joined with errors.Join.
type ConfigError struct {
	Field  string
	Reason string
}

func (e *ConfigError) Error() string {
	return "tidemark: invalid Config." + e.Field + ": " + e.Reason
}

// withDefaults returns a copy of c with defaults filled in and validates it.
func (c Config) withDefaults() (Config, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)})
	}
	setDur := func(field string, d *time.Duration, def time.Duration) {
		switch {
		case *d == 0:
			*d = def
		case *d < 0:
			bad(field, "must not be negative, got %s", *d)
		}
	}

	if len(c.Brokers) == 0 {
		bad("Brokers", "at least one broker address is required")
	}
	for _, b := range c.Brokers {
		if _, port, err := net.SplitHostPort(b); err != nil || port == "" {
			bad("Brokers", "%q is not a host:port address", b)
		}
	}
	if strings.TrimSpace(c.GroupID) == "" {
		bad("GroupID", "a consumer group id is required")
	}
	if len(c.Topics) == 0 {
		bad("Topics", "at least one topic is required")
	}
	seen := map[string]bool{}
	for _, t := range c.Topics {
		switch {
		case t == "":
			bad("Topics", "empty topic name")
		case seen[t]:
			bad("Topics", "topic %q listed twice", t)
		}
		seen[t] = true
	}
	if c.OffsetFile == "" {
		bad("OffsetFile", "a path for the local offset file is required")
	}
	switch set := btoi(c.Handler != nil) + btoi(c.BatchHandler != nil) + btoi(c.TxHandler != nil); {
	case set == 0:
		bad("Handler", "a Handler (or a BatchHandler or TxHandler) is required")
	case set > 1:
		bad("BatchHandler", "set one of Handler, BatchHandler and TxHandler")
	case c.TxHandler != nil && c.Ordering != OrderPartition:
		bad("Ordering", "a TxHandler requires OrderPartition: concurrent runs of one partition would each see the state without the others' changes")
	}
	switch {
	case c.StateChangelog == "":
	case c.TxHandler == nil:
		bad("StateChangelog", "applies to a TxHandler only: other handlers keep no state")
	case strings.TrimSpace(c.StateChangelog) != c.StateChangelog:
		bad("StateChangelog", "suffix %q has leading or trailing spaces", c.StateChangelog)
	default:
		for _, t := range c.Topics {
			if seen[t+c.StateChangelog] {
				bad("StateChangelog", "the changelog of %q is %q, a consumed topic", t, t+c.StateChangelog)
			}
		}
	}
	switch {
	case !c.StateRebuild:
	case c.TxHandler == nil:
		bad("StateRebuild", "applies to a TxHandler only: other handlers keep no state")
	case c.StateChangelog != "":
		bad("StateRebuild", "applies without a StateChangelog only: a changelog restores the state instead")
	}
	switch {
	case c.Handler != nil && c.BatchSize != 0:
		bad("BatchSize", "applies to a BatchHandler only; a Handler gets one message per call")
	case c.Handler != nil && c.BatchLinger != 0:
		bad("BatchLinger", "applies to a BatchHandler only; a Handler gets one message per call")
	case c.BatchSize < 0:
		bad("BatchSize", "must not be negative, got %d", c.BatchSize)
	case c.BatchLinger < 0:
		bad("BatchLinger", "must not be negative, got %s", c.BatchLinger)
	}
	switch {
	case c.Handler != nil:
		c.BatchSize = 1
	case c.BatchSize == 0:
		c.BatchSize = 100
	}
	switch c.Ordering {
	case OrderPartition:
		switch c.MaxInFlight {
		case 0:
			c.MaxInFlight = 1
		case 1:
		default:
			bad("MaxInFlight", "must be 1 with OrderPartition (one call at a time per partition), got %d; choose OrderKey or OrderNone for concurrent calls", c.MaxInFlight)
		}
	case OrderKey, OrderNone:
		switch {
		case c.MaxInFlight == 0:
			c.MaxInFlight = 100
		case c.MaxInFlight < 0:
			bad("MaxInFlight", "must not be negative, got %d", c.MaxInFlight)
		}
	default:
		bad("Ordering", "unknown ordering %d", int(c.Ordering))
	}
	switch {
	case c.MaxUndurable == 0:
		c.MaxUndurable = 100000
	case c.MaxUndurable < 0:
		bad("MaxUndurable", "must not be negative, got %d", c.MaxUndurable)
	}
	switch {
	case c.MaxWindow == 0:
		c.MaxWindow = 10000
	case c.MaxWindow < 0:
		bad("MaxWindow", "must not be negative, got %d", c.MaxWindow)
	case c.MaxWindow < c.MaxInFlight*c.BatchSize:
		bad("MaxWindow", "%d is below MaxInFlight x BatchSize (%d): calls could not be filled", c.MaxWindow, c.MaxInFlight*c.BatchSize)
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	setDur("CommitInterval", &c.CommitInterval, time.Second)
	switch {
	case c.SyncInterval == 0:
		c.SyncInterval = time.Second
	case c.SyncInterval < 0:
		c.SyncInterval = 0 // every write fsync-ed, no journal
	}
	switch {
	case c.FlushInterval == 0:
		c.FlushInterval = 5 * time.Millisecond
	case c.FlushInterval < 0:
		c.FlushInterval = 0 // group commit: the offset file's writer without a least interval
	}
	switch c.StartOffset {
	case 0:
		c.StartOffset = kafka.FirstOffset
	case kafka.FirstOffset, kafka.LastOffset:
	default:
		bad("StartOffset", "must be kafka.FirstOffset (-2) or kafka.LastOffset (-1), got %d", c.StartOffset)
	}
	switch c.OutOfRange {
	case ResetToEarliest, ResetToLatest, Stall:
	default:
		bad("OutOfRange", "unknown policy %d", int(c.OutOfRange))
	}
	switch c.IsolationLevel {
	case kafka.ReadUncommitted, kafka.ReadCommitted:
	default:
		bad("IsolationLevel", "must be kafka.ReadUncommitted (0) or kafka.ReadCommitted (1), got %d", c.IsolationLevel)
	}
	setDur("DrainTimeout", &c.DrainTimeout, 5*time.Second)
	setDur("RetryBackoff", &c.RetryBackoff, 100*time.Millisecond)
	setDur("MaxRetryBackoff", &c.MaxRetryBackoff, 10*time.Second)
	if c.MaxRetryBackoff < c.RetryBackoff {
		bad("MaxRetryBackoff", "%s is below RetryBackoff %s", c.MaxRetryBackoff, c.RetryBackoff)
	}
	switch c.GroupProtocol {
	case "", GroupProtocolClassic:
		c.GroupProtocol = GroupProtocolClassic
		if c.GroupRemoteAssignor != "" {
			bad("GroupRemoteAssignor", "%q needs GroupProtocol %q: the classic protocol's assignor runs in the client", c.GroupRemoteAssignor, GroupProtocolConsumer)
		}
	case GroupProtocolConsumer:
		if c.SessionTimeout != 0 {
			bad("SessionTimeout", "%s is not used by GroupProtocol %q: the broker's group.consumer.session.timeout.ms applies; leave it unset", c.SessionTimeout, GroupProtocolConsumer)
		}
		if c.HeartbeatInterval != 0 {
			bad("HeartbeatInterval", "%s is not used by GroupProtocol %q: the broker's group.consumer.heartbeat.interval.ms applies; leave it unset", c.HeartbeatInterval, GroupProtocolConsumer)
		}
		if strings.TrimSpace(c.GroupRemoteAssignor) != c.GroupRemoteAssignor {
			bad("GroupRemoteAssignor", "%q has surrounding spaces", c.GroupRemoteAssignor)
		}
	default:
		bad("GroupProtocol", "must be %q (default) or %q, got %q", GroupProtocolClassic, GroupProtocolConsumer, c.GroupProtocol)
	}
	setDur("SessionTimeout", &c.SessionTimeout, 10*time.Second)
	setDur("HeartbeatInterval", &c.HeartbeatInterval, 3*time.Second)
	setDur("RebalanceTimeout", &c.RebalanceTimeout, 30*time.Second)
	setDur("JoinGroupBackoff", &c.JoinGroupBackoff, 2*time.Second)
	if c.HeartbeatInterval >= c.SessionTimeout {
		bad("HeartbeatInterval", "%s must be below SessionTimeout %s", c.HeartbeatInterval, c.SessionTimeout)
	}
	if budget := c.RebalanceTimeout - c.HeartbeatInterval; c.DrainTimeout >= budget {
		bad("DrainTimeout", "%s must be below RebalanceTimeout - HeartbeatInterval (%s), or the final commit on revoke is fenced", c.DrainTimeout, budget)
	}
	c.Failure = c.Failure.withDefaults("Failure", bad, seen)
	if len(c.TopicFailure) > 0 {
		tf := make(map[string]FailurePolicy, len(c.TopicFailure))
		for t, fp := range c.TopicFailure {
			if !seen[t] {
				bad("TopicFailure", "topic %q is not in Topics", t)
			}
			tf[t] = fp.withDefaults(fmt.Sprintf("TopicFailure[%q]", t), bad, seen)
		}
		c.TopicFailure = tf
	}
	if c.CrashLoopRestarts == 0 {
		c.CrashLoopRestarts = 3
	}
	setDur("FetchMaxWait", &c.FetchMaxWait, 500*time.Millisecond)
	setDur("MetadataMaxAge", &c.MetadataMaxAge, 5*time.Minute)
	switch {
	case c.FetchMaxBytes == 0:
		c.FetchMaxBytes = 1 << 20
	case c.FetchMaxBytes < 0:
		bad("FetchMaxBytes", "must not be negative, got %d", c.FetchMaxBytes)
	}
	switch {
	case c.MaxBufferedBytes == 0:
		c.MaxBufferedBytes = 16 << 20
	case c.MaxBufferedBytes < 0:
		bad("MaxBufferedBytes", "must not be negative, got %d", c.MaxBufferedBytes)
	}
	setDur("Timeout", &c.Timeout, 10*time.Second)
	if err := validInspectSocket(c.InspectSocket); err != nil {
		bad("InspectSocket", "%v", err)
	}
	if c.StatusAddr != "" {
		if _, err := statusListenAddr(c.StatusAddr); err != nil {
			bad("StatusAddr", "%v", err)
		}
	}
	if c.ClientID == "" {
		c.ClientID = "tidemark"
	}
	return c, errors.Join(errs...)
}

// withDefaults validates fp, reporting problems under field, and fills in
// MaxAttempts.
func (fp FailurePolicy) withDefaults(field string, bad func(field, format string, args ...any), topics map[string]bool) FailurePolicy {
	switch fp.Action {
	case Retry:
		if fp.MaxAttempts != 0 {
			bad(field+".MaxAttempts", "must be 0 with Action Retry (retry forever), got %d; choose DeadLetter, Skip or Stop to give up", fp.MaxAttempts)
		}
		return fp
	case DeadLetter:
		switch {
		case strings.TrimSpace(fp.DeadLetterTopic) == "":
			bad(field+".DeadLetterTopic", "required with Action DeadLetter")
		case topics[fp.DeadLetterTopic]:
			bad(field+".DeadLetterTopic", "%q is a consumed topic: failed messages would come back forever", fp.DeadLetterTopic)
		}
	case Skip, Stop:
	default:
		bad(field+".Action", "unknown action %d", int(fp.Action))
		return fp
	}
	switch {
	case fp.MaxAttempts == 0:
		fp.MaxAttempts = 5
	case fp.MaxAttempts < 0:
		bad(field+".MaxAttempts", "must not be negative, got %d", fp.MaxAttempts)
	}
	return fp
}

// policy returns the failure policy of topic.
func (c *Config) policy(topic string) FailurePolicy {
	if fp, ok := c.TopicFailure[topic]; ok {
		return fp
	}
	return c.Failure
}

// deadLetterTopics lists the dead-letter topics the policies use.
func (c *Config) deadLetterTopics() []string {
	var out []string
	add := func(fp FailurePolicy) {
		if fp.Action == DeadLetter && !slices.Contains(out, fp.DeadLetterTopic) {
			out = append(out, fp.DeadLetterTopic)
		}
	}
	add(c.Failure)
	for _, t := range c.Topics {
		if fp, ok := c.TopicFailure[t]; ok {
			add(fp)
		}
	}
	return out
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
