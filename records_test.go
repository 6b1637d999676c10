package tidemark_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"hash/crc32"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// The broker's record batches as the fetcher may meet them. The fault proxy
// rewrites Fetch responses into what a broker sends after compaction, or
// into a record that does not decode, so both tests run on kfake and on
// Apache Kafka alike.

// A record that cannot be decoded stops its partition, visibly, at that
// record: nothing after it is handled, the watermark and the commit stay on
// it. (The engine before the fetch-by-broker rewrite dropped the rest of the
// batch and went on with the next one.)
func TestUndecodableRecordStopsPartition(t *testing.T) {
	cl, topic := newTopic(t, 1, 20) // offsets 0..19: one batch
	cl.Produce(t, topic, 1, 20, 20) // 20..39: a second batch
	cl.Proxy.OnFetch(func(tp string, _ int32, raw []byte) []byte {
		if tp != topic {
			return raw
		}
		return rewriteBatches(raw, func(base, offset int64, rec []byte) []byte {
			if offset != 10 {
				return rec
			}
			// The last byte of a record without headers is its header
			// count, 0; 63 headers run past the record's end.
			bad := append([]byte(nil), rec...)
			bad[len(bad)-1] = 0x7e
			return bad
		})
	})
	group := testsupport.Name(t, "g")
	rec := newRecorder()
	r := startConsumer(t, baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db"), rec))
	waitFor(t, time.Minute, "the partition stalled", func() bool {
		ps := r.c.Stats().Partitions
		return len(ps) == 1 && ps[0].State == framework.StateStalled
	})
	waitFor(t, 10*time.Second, "the watermark committed", func() bool {
		c, err := cl.TryCommitted(group, topic, 1)
		return err == nil && c[0] == 10
	})
	p := r.c.Stats().Partitions[0]
	r.stop(t)
	if lost, dups := rec.check(1, offsets(1, 0), offsets(1, 10)); len(lost) > 0 || dups > 0 {
		t.Fatalf("before the bad record: %d lost (%v), %d twice", len(lost), head(lost), dups)
	}
	if n := rec.count(); n != 10 {
		t.Fatalf("%d messages handled, want the 10 before the bad record and none after it", n)
	}
	if p.Processed != 10 || !strings.Contains(p.LastError, "offset 10") || !strings.Contains(p.LastError, "malformed record") {
		t.Fatalf("stalled partition: processed %d, last error %q; want 10 and a decoding error naming offset 10", p.Processed, p.LastError)
	}
	if c := cl.Committed(t, group, topic, 1); c[0] != 10 {
		t.Fatalf("committed %d after the stall, want 10", c[0])
	}
	t.Logf("stalled: %s", p.LastError)
}

// Compaction keeps a batch's last offset when it removes the batch's last
// records, and an idempotent producer's batch stays, empty, when all of its
// records are removed. The watermark, lag and commit must reach the log end
// over both. (The engine before the rewrite read batches through kafka-go,
// which drops the last offset delta, and stopped short forever.)
func TestCompactedBatchesReachLogEnd(t *testing.T) {
	for _, tc := range []struct {
		name    string
		drop    func(base, offset int64) bool
		handled int // of 0..14
	}{
		// 0..9 in one batch whose last two records were compacted away.
		{"last records removed", func(base, offset int64) bool { return base == 0 && offset >= 8 }, 8 + 5},
		// 10..14 in a batch left empty.
		{"empty batch at the tail", func(base, offset int64) bool { return base == 10 }, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, topic := newTopic(t, 1, 10)
			cl.Produce(t, topic, 1, 10, 5)
			cl.Proxy.OnFetch(func(tp string, _ int32, raw []byte) []byte {
				if tp != topic {
					return raw
				}
				return rewriteBatches(raw, func(base, offset int64, rec []byte) []byte {
					if tc.drop(base, offset) {
						return nil
					}
					return rec
				})
			})
			group := testsupport.Name(t, "g")
			rec := newRecorder()
			cfg := baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db"), rec)
			cfg.FetchMaxBytes = 1 // one batch a response: the rewritten one comes alone
			r := startConsumer(t, cfg)
			waitFor(t, 30*time.Second, "the watermark at the log end", func() bool {
				ps := r.c.Stats().Partitions
				return len(ps) == 1 && ps[0].Processed == 15 && ps[0].Lag == 0
			})
			waitFor(t, 10*time.Second, "the commit at the log end", func() bool {
				c, err := cl.TryCommitted(group, topic, 1)
				return err == nil && c[0] == 15
			})
			r.stop(t)
			if n := rec.count(); n != tc.handled {
				t.Fatalf("%d messages handled, want %d", n, tc.handled)
			}
		})
	}
}

// rewriteBatches rewrites each record of the uncompressed v2 batches in raw
// with fn (nil drops the record), keeping each batch's base and last offset
// as Kafka's log cleaner does, and fixes the count, length and CRC.
func rewriteBatches(raw []byte, fn func(base, offset int64, rec []byte) []byte) []byte {
	var out []byte
	for len(raw) >= 61 {
		n := 12 + int(binary.BigEndian.Uint32(raw[8:]))
		if n > len(raw) {
			break // cut short by the response's size limit: forwarded as is
		}
		batch := raw[:n]
		raw = raw[n:]
		base := int64(binary.BigEndian.Uint64(batch))
		count := int(binary.BigEndian.Uint32(batch[57:]))
		recs := batch[61:]
		var kept []byte
		nk := 0
		for i := 0; i < count; i++ {
			l, k := binary.Varint(recs)
			rec := recs[:k+int(l)]
			recs = recs[k+int(l):]
			body := rec[k+1:] // after the length and the attributes byte
			_, k1 := binary.Varint(body)
			delta, _ := binary.Varint(body[k1:])
			if r := fn(base, base+delta, rec); r != nil {
				kept = append(kept, r...)
				nk++
			}
		}
		nb := append(append([]byte(nil), batch[:61]...), kept...)
		binary.BigEndian.PutUint32(nb[8:], uint32(len(nb)-12))
		binary.BigEndian.PutUint32(nb[57:], uint32(nk))
		binary.BigEndian.PutUint32(nb[17:], crc32.Checksum(nb[21:], crc32.MakeTable(crc32.Castagnoli)))
		out = append(out, nb...)
	}
	return append(out, raw...)
}

// The same on a real log cleaner: an idempotent producer's last batch stays,
// empty, after compaction removed its only record, and comes alone in a
// fetch when the batch after it is larger than the fetch size. On Apache
// Kafka the topic gets small segments and a low dirty ratio (scripts/kafka-
// local sets log.cleaner.backoff.ms=1000); kfake's Compact drops empty
// batches, so there the test only checks that compaction loses nothing.
func TestCompactedTopicReachesLogEnd(t *testing.T) {
	cl := testsupport.Start(t)
	topic := testsupport.Name(t, "compact")
	cl.CreateTopicWith(t, topic, 1, map[string]string{
		"cleanup.policy":            "compact",
		"segment.ms":                "100",
		"min.cleanable.dirty.ratio": "0.001",
		"delete.retention.ms":       "0",
		"min.compaction.lag.ms":     "0",
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	produce := func(key string, value []byte) int64 {
		t.Helper()
		// A producer of its own for each record: each is the last batch of
		// an idempotent producer, which the cleaner keeps even when empty.
		kc, err := kgo.NewClient(kgo.SeedBrokers(cl.Upstream), kgo.DefaultProduceTopic(topic),
			kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(2<<20))
		if err != nil {
			t.Fatal(err)
		}
		defer kc.Close()
		r, err := kc.ProduceSync(ctx, &kgo.Record{Key: []byte(key), Value: value}).First()
		if err != nil {
			t.Fatalf("producing %s: %v", key, err)
		}
		return r.Offset
	}
	produce("a", []byte("old"))                            // 0: removed by compaction, its batch kept empty
	produce("a", bytes.Repeat([]byte("n"), 900<<10))       // 1: larger than a fetch asks for
	time.Sleep(300 * time.Millisecond)                     // past segment.ms: the next append rolls the segment
	if end := produce("b", []byte("tail")) + 1; end != 3 { // 2: in the active segment
		t.Fatalf("log end %d, want 3", end)
	}
	if cl.Fake != nil {
		cl.Fake.Compact()
	}
	// Wait for the cleaner: offset 0's record is gone.
	waitFor(t, time.Minute, "the log cleaner to remove offset 0", func() bool {
		kc, err := kgo.NewClient(kgo.SeedBrokers(cl.Upstream), kgo.FetchMaxBytes(4<<20),
			kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().At(0)}}))
		if err != nil {
			t.Fatal(err)
		}
		defer kc.Close()
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		fs := kc.PollFetches(pctx)
		first := int64(-1)
		fs.EachRecord(func(r *kgo.Record) {
			if first < 0 {
				first = r.Offset
			}
		})
		return first == 1
	})
	group := testsupport.Name(t, "g")
	rec := newRecorder()
	cfg := baseConfig(t, cl, group, topic, filepath.Join(t.TempDir(), "o.db"), countOnly{rec})
	cfg.FetchMaxBytes = 64 << 10
	r := startConsumer(t, cfg)
	waitFor(t, 30*time.Second, "the watermark at the log end", func() bool {
		ps := r.c.Stats().Partitions
		return len(ps) == 1 && ps[0].Processed == 3 && ps[0].Lag == 0
	})
	waitFor(t, 10*time.Second, "the commit at the log end", func() bool {
		c, err := cl.TryCommitted(group, topic, 1)
		return err == nil && c[0] == 3
	})
	r.stop(t)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if got := rec.seen[0]; len(got) != 2 || got[1] != 1 || got[2] != 1 {
		t.Fatalf("handled %v, want offsets 1 and 2 once", got)
	}
}
