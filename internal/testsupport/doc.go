// Package testsupport is what tidemark's tests share: a broker, polling,
// a recording Handler and the exactly-once assertion, child processes and
// log observers. It is test support, imported only from _test.go files.
//
// It does not import package framework, so that framework's own white-box
// tests (package framework) can use it; what needs a framework.Consumer
// (a Config with short intervals, running and stopping a Consumer, its
// Stats invariants, a consumer child process) is in its subpackage
// frameworktest.
//
// # The broker
//
// Start gives a test a broker of its own: the in-process kfake broker by
// default, or the real Kafka named by KAFKA_BROKERS (RealBroker), always
// behind the Kafka-aware fault proxy of internal/kafkaproxy
// (Cluster.Proxy), so that the same fault scenarios run on both. Clients
// under test use Cluster.Brokers (the proxy); setup and checks go straight
// to the broker (Cluster.Upstream, Cluster.Client): CreateTopic,
// CreateTopicWith, WaitLeaders, DeleteTopic, WaitDeleted, Produce and
// ProduceKeyed (payloads from Value), DeleteRecords, CommitOffsets,
// Committed and TryCommitted, Bounds. Name gives each test its own topics
// and groups, so that tests can run in parallel and share a real broker;
// FixedName keeps a readable name on the in-process broker. NewTopic is
// Start with a topic already filled. NewProducer, ProduceSync and
// ValueRecords write with franz-go's idempotent producer, which loses
// nothing while leaders move.
//
// # Waiting
//
// WaitFor polls a condition until it holds or a timeout passes, and fails
// the test naming what it waited for; WaitForNoError does the same for a
// step that fails for a while, and reports its last error.
//
// # What was handled
//
// Recorder is a Handler that counts how often each offset of each topic
// was handled and checks each payload. ExactlyOnce is the one exactly-once
// assertion: it fails the test unless every offset in a range of each
// partition was handled exactly once, counting what was lost and what was
// handled twice and naming the first of each. NoneLost is the same for a
// test that allows duplicates (after a SIGKILL), and returns them for the
// test to bound. Check computes what both assert. They take any Handled:
// a Recorder or one of its Topic views, a Ledger, a HandledFunc, or a
// test's own type (with Describer, its failure message says more).
//
// # Child processes
//
// StartChild runs the test binary again as a child process, to have a real
// process to SIGKILL (Child.Kill) or stop with SIGTERM (Child.Stop); the
// test binary's TestMain calls ChildMain first. HoldLock holds an offset
// file's lock in a child. A consumer child writes what it handled to a
// ledger file that a SIGKILL cannot undo; ReadLedger reads it.
//
// # Logs
//
// Logger logs warnings and errors to the test (every level with
// TIDEMARK_DEBUG set); ObservedLogger also keeps the entries for the test
// to assert on; StatusURL finds the status server's address in them.
//
// # Caveats
//
// Helpers that fail the test call t.Fatal, and so must run on the test's
// goroutine. A Cluster, Child and everything they start are closed by
// t.Cleanup when the test ends. The one os.Exit in the package's children
// is the consumer child's deliberate hard exit (frameworktest.Child's
// CrashAt); ChildMain returns the exit status for TestMain to exit with.
package testsupport
