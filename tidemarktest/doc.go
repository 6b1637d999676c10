// Package tidemarktest helps test a service built on tidemark, as
// net/http/httptest does for an HTTP server: a broker for the test, topics
// and keyed messages on it, a Consumer run until the test has what it
// waits for, and a check of what the Handler got.
//
//	func TestBilling(t *testing.T) {
//		b := tidemarktest.NewBroker(t)
//		topic := b.CreateTopic(t, "orders", 3)
//		msgs := b.Produce(t, topic, tidemarktest.Keyed(1000, 10)...)
//		rec := tidemarktest.NewRecorder(billing.NewHandler())
//		tidemarktest.Run(t, framework.Config{
//			Brokers:  b.Brokers(),
//			Topics:   []string{topic},
//			Handler:  rec,
//			Ordering: framework.OrderKey,
//		}, tidemarktest.Processed(msgs))
//		if err := rec.Check(msgs); err != nil {
//			t.Fatal(err) // names the first message lost, repeated or out of order
//		}
//	}
//
// # The broker
//
// NewBroker starts franz-go's in-process broker (kfake; nothing to
// install), or uses the real cluster named by KAFKA_BROKERS, so that the
// same test runs on both. CreateTopic creates a topic and waits for its
// leaders. Produce writes messages with franz-go's idempotent producer,
// partitioned by key as Kafka's Java client does, and returns them with
// their partitions and offsets: the record of what the consumer must get.
// Keyed makes messages of a number of keys.
//
// # Running a Consumer
//
// Run builds a framework.Consumer, runs it until a Condition holds
// (Handled, Processed, Broker.CommittedAtEnd, or a function of the test's
// own), and stops it as a service stops: it drains, flushes, commits and
// returns, every goroutine it started awaited. It puts the offset file in
// t.TempDir().
//
// # Checking commits
//
// Broker.Committed returns a group's committed offsets of a topic as Kafka
// holds them, one per partition (-1 where none): where a restart, or the
// next owner of a partition, resumes. Broker.CommittedAtEnd is the
// Condition that waits until those reach the log ends.
//
// # Checking delivery
//
// A Recorder sits in front of the Handler (NewRecorder, NewBatchRecorder,
// or Recorder.Middleware in a handler.Chain) and records each message the
// Handler returned nil for. Check compares the record with what was
// produced and returns nil, or a *DeliveryError that lists the messages
// lost, handled more than once, handled out of their key's order and
// handed over with another key or value than produced, each named by
// topic, partition, offset and key, the first of each in its message. AllowDuplicates and IgnoreOrder relax it for at-least-once
// tests and for framework.OrderNone. Verify is Check reported with t.Error.
//
// # Caveats
//
// Helpers that fail the test call t.Fatal, and so must run on the test's
// goroutine; Run polls its Condition there too. Everything they start (the
// broker, the producer, the Consumer) ends before the test's cleanup is
// done: Run returns only after Consumer.Run did.
//
// On a real cluster, tests share the broker: CreateTopic and Broker.Name
// add a unique suffix to the names they are given (on the in-process
// broker the names are kept as given), topics are deleted when the test
// ends, and Run's default GroupID is unique to the test. Broker.Fake and
// its controls exist only in process: a test that uses them calls
// NewBroker with InProcess.
//
// "Handled" means the Handler returned nil. A message the failure policy
// skipped or dead-lettered was not handled, and Check reports it lost:
// leave it out of the messages checked if that is what the test expects.
// Check orders by key within a partition, in the order the calls
// returned: what framework.OrderKey and OrderPartition promise. Messages
// without a key have no order to keep. A message handled again after a
// restart is a repeat, not a reordering.
//
// The Recorder keeps every message it records, bytes included: a test of
// millions of messages should Reset it between steps.
package tidemarktest
