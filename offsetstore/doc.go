// Package offsetstore reads a tidemark offset file: the local bbolt file in
// which a consumer records the offsets it has handled, the source of truth
// from which it commits to Kafka.
//
// A service never needs it to consume: framework.Consumer opens and writes
// the file itself. It is for a program that looks at the file from outside,
// as the bundled command does: open it read-only and export each
// partition's progress as Go values ([Open], [File.Partitions],
// [File.Lookup]), read a TxHandler's state ([File.ViewState]), or check it
// for damage ([Check]). The JSON document that moves a file between hosts is
// `tidemark export`'s (and `tidemark import`'s). The file's format and the
// writer live in an internal package; what is here is the stable view of
// them.
//
// # Caveats
//
//   - A running consumer holds the file's exclusive lock: Open then fails
//     with an error wrapping ErrInUse. Read a live consumer's records through
//     its inspect endpoint instead (tidemark inspect).
//   - What Open reads is what survived the process: a journal left by a
//     crash is applied in memory, never written back.
//   - Partitions reports the file's records, not Kafka's committed offsets;
//     Committed is only the last commit the consumer saw confirmed.
package offsetstore
