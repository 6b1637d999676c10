// Package offsetfile keeps, in a local bbolt file, the offsets a tidemark
// consumer has processed. The file, not Kafka, is the source of truth: the
// framework commits to Kafka only watermarks the file already holds.
//
// # What it stores
//
// One Record per Key (consumer group, topic, partition):
//
//   - Watermark: the next offset to process; every offset below it is done.
//     With it, RecordedAt and the Generation and Member of the group
//     member that recorded it.
//   - Completed: the offsets completed above the watermark, as sorted,
//     disjoint ranges [From, To), for a consumer that completes a
//     partition's messages out of order: after a crash, a restart need not
//     handle them again. They are written in the same value, so the same
//     transaction, as the watermark they go with: whatever sets the
//     watermark sets them too (a Marker of NewProgressMarker reads both
//     from its Progress; SetWatermark and RecordReset clear them).
//   - Committed: the last offset known committed to Kafka, and when.
//   - LastReset: the last watermark reset decided by policy (records
//     deleted by retention, topic recreated), with its reason.
//   - Run: for the crash-loop breaker, whether the run holding the
//     partition released it cleanly, the offset in flight when it was last
//     recorded in careful mode, and how many unclean ends in a row happened
//     on it.
//   - Skipped and DeadLettered: how many messages the failure policy gave
//     up on, each offset counted once; the newest are listed, with their
//     offset, time, attempts and reason, by Failures (RecordFailure adds
//     one).
//   - LastCommit: the commit ledger, the last commit attempt to Kafka with
//     its offset, generation, time, outcome (ok, fenced, error, unknown)
//     and latency; Committed is the last confirmed one.
//
// # Durability: Get, Durable and Synced
//
// SetWatermark, SetCommitted, SetRun, SetCommitAttempt, RecordReset,
// RecordFailure and Put, and the Markers' Set and Changed, only queue an
// update in
// memory (a map under a mutex; the latest value per key wins, merged field by
// field) and return at once. One writer goroutine per Store writes
// everything queued in a single bbolt transaction, fsyncs it, and then
// publishes the records as durable. Updates that arrive while a
// transaction is being written go into the next one (group commit), so the
// number of fsyncs does not grow with the number of partitions or updates.
// Options.FlushInterval can space transactions further apart.
//
// Get returns the latest value, queued or not; Durable returns the value as
// last persisted: after a crash of the process, Open returns exactly the
// Durable records. Flush waits until everything queued before the call is
// durable.
//
// With Options.SyncInterval, most flushes are not transactions: they append
// the records they change to a journal beside the file (its path plus
// JournalSuffix) with one write (or one copy into its mapped first 256
// KiB) and no fsync, which the kernel keeps when the process dies. A
// checkpoint, at most every SyncInterval, on Sync and on Close, writes them
// into the file in one fsync-ed transaction and empties the journal (Close
// removes it). Synced returns the value as of
// the last checkpoint, which survives a crash of the machine too: only a
// Synced watermark may be committed to Kafka. After a crash of the
// machine, Open returns the Synced records with a prefix of the journal's
// entries applied (each entry is checksummed; a torn tail is ignored);
// after a crash of the process, the Durable ones. Without SyncInterval
// every flush is a checkpoint, and Synced is Durable. journal.go has the
// entry layout and how an entry older than the last checkpoint is told
// apart.
//
// If a transaction fails, the error is logged, reported by Err and returned
// to waiting Flush callers; the updates stay queued (newer ones still win)
// and the writer retries with a capped backoff (10ms to 500ms).
//
// # File layout
//
// The bbolt file has these top-level buckets:
//
//	meta              key "schema": SchemaVersion, 4 bytes big-endian;
//	                  key "journal": the journal generation of the last
//	                  checkpoint, 8 bytes big-endian (absent: none yet)
//	groups
//	  <group>         one bucket per consumer group
//	    <topic>       one bucket per topic
//	      <partition> key: partition, 4 bytes big-endian; value: the Record
//	failures          (created with the first entry)
//	  <group>
//	    <topic>
//	      <key>       key: partition (4 bytes) and offset (8 bytes), big-endian;
//	                  value: a Failure (version byte 1, then varints)
//	state             (created with the first state change; state.go)
//	  <group>
//	    <topic>
//	      <partition> key: partition, 4 bytes big-endian; one bucket
//	        <key>     a state key (1 to MaxStateKey bytes); value: a format
//	                  byte (0), then the value (up to MaxStateValue)
//
// A partition's state is changed by runs (BeginState, StateTx.Commit): each
// run's changes are queued with the partition's watermark and written with
// it in one checkpoint, never to the journal, so the file's watermark and
// state always agree.
//
// Groups sit under "groups" rather than at the top level so that a consumer
// group may be called "meta". A Record value is a version byte (2; files
// written with version 1 values are still read) and a flags varint, followed
// by varints: offsets, generation, times as Unix nanoseconds,
// length-prefixed strings, and the optional reset, run state, counts, last
// commit attempt and completed ranges (see codec.go). Values are decoded
// strictly; a value that does not decode makes Open fail, naming the group,
// topic and partition (the failure entries too: their bucket and key).
//
// Completed ranges are flag 256 of value version 2, stored as deltas from
// the watermark. A record without them is written exactly as before the
// flag existed, so older builds read it; a build without the flag refuses
// a file holding a record with ranges (Open fails with an "unknown flags"
// error naming the partition) rather than misread it.
//
// # Schema version
//
// SchemaVersion is 1. Open initialises a new file, or a bbolt file with no
// buckets, to it. It refuses, with an error wrapping ErrSchema that says
// which version it found and which it supports, a file with another version
// and a bbolt file that has buckets but no "meta" bucket. Files that are not
// bbolt at all are refused with ErrSchema too. A refused or damaged file is
// never written to.
//
// # Damaged files
//
// Open checks the whole file before it returns (Check's checks, bbolt's
// own tx.Check aside): it walks every page of bbolt's tree with its own
// bounds-checked reader (pages.go), then decodes every record and every
// failure entry. A file with an error finding is refused with an error
// wrapping ErrDamaged that names the file, the first finding and how to
// recover (Salvage, which `tidemark export --salvage` uses, reads what is
// sound; or move the file aside). So is a truncated file and a 0-byte one:
// an existing empty file is not taken as a new one, since a file that lost
// its history looks the same; delete it to start with none. The check
// adds 20-35 ms to the Open of a file of 10,000 partitions (BenchmarkOpen).
//
// bbolt trusts its pages: a damaged one makes it panic, or fault reading
// outside its mapping. Where bbolt reads after Open (Failures, the read of
// RecordFailure, the flush transaction) the call runs under recover with
// debug.SetPanicOnFault, and a panic of bbolt becomes an error wrapping
// ErrDamaged; this package's own decoding is bounds-checked and returns
// errors. bbolt's tx.Check panics in a goroutine of its own, out of any
// recover's reach, so Check runs it only once its own page walk found the
// pages sound.
//
// # Caveats
//
//   - One process per file. Open takes bbolt's flock, waiting at most
//     Options.Timeout (default 1s, never forever) and then failing with
//     ErrInUse. The lock is per open file, so a second Open of the same path
//     in the same process is refused as well. Read-only opens share the lock
//     with each other, not with a read-write Open.
//   - Options.NoSync skips fsync: after a machine crash, or power loss, records
//     reported Synced may be lost or the file corrupted. Use it for
//     benchmarks only.
//   - The journal is part of the file: a copy of the file alone, while a
//     consumer runs or after a crash, lacks what the journal holds beyond
//     the last checkpoint (at most SyncInterval of updates). Copy both, or
//     copy after a Close. Salvage reads the bbolt file only. Check
//     reports the journal's entries, and Open refuses a journal with a
//     whole entry that does not decode (not a torn write), saying how to
//     recover: the file itself is sound. A build from before the journal
//     ignores it (and warns about the "journal" key of the meta bucket):
//     opened by one after a crash, the file is as of its last checkpoint,
//     and what the journal held is handled again, not lost (Kafka's commits
//     never pass a checkpoint).
//   - Time source: RecordedAt, CommittedAt and a zero Reset.At are taken from
//     the wall clock (time.Now) of this machine, when the update is queued,
//     and stored to the nanosecond without the monotonic reading. They are
//     informative; nothing in the store orders updates by them. Times before
//     1678 or after 2262 cannot be stored.
//   - The store keeps every record in memory; Records, Get and Durable never
//     touch the disk. Failure entries stay on disk: Failures reads them.
//     Each flush that writes entries for a partition prunes them to the
//     newest Options.KeepFailures (10,000 by default, about 50 bytes plus
//     the reason each), deleting only entries below the durable watermark;
//     the counts keep the totals. A read-only Store shows the file as it
//     was at Open.
//   - The store does not check that watermarks move forward: the latest
//     queued value wins. Ordering is the caller's policy.
//   - Group and topic must be non-empty; names are limited to 32 KiB, member
//     ids and reset reasons to 64 KiB, completed ranges to 2,097,152 per
//     record. Invalid updates are refused when queued, so a transaction can
//     only fail for I/O reasons; completed ranges a Progress returns that
//     break the rules are dropped when folded (the watermark is kept, and
//     the offsets are handled again after a restart).
//   - The store keeps completed ranges as it is given them: each flush of a
//     record writes all of them, and Get, Durable and Records return copies.
//     Many ranges cost memory and flush time; a consumer keeps them few by
//     bounding the offsets it handles ahead of its watermark.
package offsetfile
