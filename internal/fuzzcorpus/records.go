package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The records topic's partitions: one per way of writing a batch.
var codecs = []struct {
	name  string
	codec kgo.CompressionCodec
}{
	{"plain", kgo.NoCompression()},
	{"gzip", kgo.GzipCompression()},
	{"snappy", kgo.SnappyCompression()},
	{"lz4", kgo.Lz4Compression()},
	{"zstd", kgo.ZstdCompression()},
}

// txnPartition holds a committed transaction, an aborted one, and a
// committed one after it: data batches with the transactional bit and
// control batches of both kinds.
var txnPartition = int32(len(codecs))

// v2 record batch layout (the part FuzzBatchRecords takes apart).
const (
	batchHeader = 61 // base offset .. record count
	offAttrs    = 21
	offLastOff  = 23
	offCount    = 57
)

func (c *capture) admin(ctx context.Context) (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(c.seeds...))
}

func createTopic(ctx context.Context, kc *kgo.Client, topic string, partitions int32) error {
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, partitions, -1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 30000
	res, err := req.RequestWith(ctx, kc)
	if err != nil {
		return fmt.Errorf("creating %s: %w", topic, err)
	}
	if err := kerr.ErrorForCode(res.Topics[0].ErrorCode); err != nil {
		return fmt.Errorf("creating %s: %w", topic, err)
	}
	return nil
}

// record is the n-th record of a partition: values that compress, a key on
// most, headers on some, one empty value.
func record(topic string, p int32, n int) *kgo.Record {
	r := &kgo.Record{Topic: topic, Partition: p, Value: fmt.Appendf(nil, "value %d of partition %d, value %d of partition %d", n, p, n, p)}
	if n%3 != 2 {
		r.Key = fmt.Appendf(nil, "key-%d", n%4)
	}
	if n%2 == 1 {
		r.Headers = []kgo.RecordHeader{{Key: "trace", Value: fmt.Appendf(nil, "t-%d", n)}, {Key: "empty"}}
	}
	if n == 5 {
		r.Value = nil
	}
	return r
}

// records produces the records topic and stores what a fetch returns.
func (c *capture) records(ctx context.Context) error {
	adm, err := c.admin(ctx)
	if err != nil {
		return err
	}
	defer adm.Close()
	c.topic = c.name("records")
	if err := createTopic(ctx, adm, c.topic, txnPartition+1); err != nil {
		return err
	}
	for p, cd := range codecs {
		kc, err := kgo.NewClient(kgo.SeedBrokers(c.seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
			kgo.ProducerBatchCompression(cd.codec), kgo.ProducerLinger(20*time.Millisecond))
		if err != nil {
			return err
		}
		// Two produce calls: two batches, the second from offset 6.
		for b := 0; b < 2; b++ {
			var recs []*kgo.Record
			for n := b * 6; n < b*6+6; n++ {
				recs = append(recs, record(c.topic, int32(p), n))
			}
			err = kc.ProduceSync(ctx, recs...).FirstErr()
			if err != nil {
				break
			}
		}
		kc.Close()
		if err != nil {
			return fmt.Errorf("producing %s/%d (%s): %w", c.topic, p, cd.name, err)
		}
	}
	if err := c.transactions(ctx); err != nil {
		return err
	}
	return c.fetches(ctx, adm)
}

func (c *capture) transactions(ctx context.Context) error {
	kc, err := kgo.NewClient(kgo.SeedBrokers(c.seeds...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.TransactionalID(c.name("txn")), kgo.ProducerLinger(20*time.Millisecond))
	if err != nil {
		return err
	}
	defer kc.Close()
	n := 0
	for _, commit := range []kgo.TransactionEndTry{kgo.TryCommit, kgo.TryAbort, kgo.TryCommit} {
		if err := kc.BeginTransaction(); err != nil {
			return err
		}
		var recs []*kgo.Record
		for i := 0; i < 3; i++ {
			recs = append(recs, record(c.topic, txnPartition, n))
			n++
		}
		if err := kc.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			return fmt.Errorf("producing to %s/%d in a transaction: %w", c.topic, txnPartition, err)
		}
		if err := kc.EndTransaction(ctx, commit); err != nil {
			return fmt.Errorf("ending a transaction on %s/%d: %w", c.topic, txnPartition, err)
		}
	}
	return nil
}

// leaders returns the address of each partition's leader (one broker leads
// them all on a single node; on a cluster the fetches go to each
// partition's own).
func leaders(ctx context.Context, conn *rawConn, c *capture, topic, name string) (map[int32]string, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	res, err := c.response(conn, name, req)
	if err != nil {
		return nil, err
	}
	m := res.(*kmsg.MetadataResponse)
	addrs := map[int32]string{}
	for _, b := range m.Brokers {
		addrs[b.NodeID] = fmt.Sprintf("%s:%d", b.Host, b.Port)
	}
	out := map[int32]string{}
	for _, t := range m.Topics {
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return nil, fmt.Errorf("metadata of %s: %w", topic, err)
		}
		for _, p := range t.Partitions {
			out[p.Partition] = addrs[p.Leader]
		}
	}
	return out, nil
}

func fetchRequest(topic string, isolation int8, offsets map[int32]int64) *kmsg.FetchRequest {
	req := kmsg.NewPtrFetchRequest()
	req.ReplicaID, req.MaxWaitMillis, req.MinBytes, req.MaxBytes = -1, 100, 1, 1<<20
	req.IsolationLevel, req.SessionEpoch = isolation, -1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = topic
	for p := int32(0); p <= txnPartition; p++ {
		off, ok := offsets[p]
		if !ok {
			continue
		}
		rp := kmsg.NewFetchRequestTopicPartition()
		rp.Partition, rp.FetchOffset, rp.LogStartOffset, rp.PartitionMaxBytes, rp.CurrentLeaderEpoch = p, off, -1, 256<<10, -1
		rt.Partitions = append(rt.Partitions, rp)
	}
	req.Topics = append(req.Topics, rt)
	return req
}

// fetches stores Fetch responses (read_uncommitted and read_committed, and
// one out of range), and each partition's batches for FuzzNextBatch and
// FuzzBatchRecords.
func (c *capture) fetches(ctx context.Context, adm *kgo.Client) error {
	boot, err := dialRaw(ctx, c.seeds[0])
	if err != nil {
		return err
	}
	defer boot.close()
	lead, err := leaders(ctx, boot, c, c.topic, "metadata")
	if err != nil {
		return err
	}
	byAddr := map[string]map[int32]int64{}
	for p, addr := range lead {
		if byAddr[addr] == nil {
			byAddr[addr] = map[int32]int64{}
		}
		byAddr[addr][p] = 0
	}
	batches := map[int32][]byte{}
	i := 0
	for addr, offs := range byAddr {
		conn, err := dialRaw(ctx, addr)
		if err != nil {
			return err
		}
		suffix := ""
		if i > 0 {
			suffix = fmt.Sprintf("-%d", i)
		}
		i++
		res, err := c.response(conn, "fetch-read-uncommitted"+suffix, fetchRequest(c.topic, 0, offs))
		if _, ok := offs[txnPartition]; ok && err == nil {
			err = c.readCommitted(conn)
		}
		if err == nil && suffix == "" {
			for p := range offs {
				_, err = c.response(conn, "fetch-out-of-range", fetchRequest(c.topic, 0, map[int32]int64{p: 1 << 40}))
				break
			}
		}
		conn.close()
		if err != nil {
			return err
		}
		for _, t := range res.(*kmsg.FetchResponse).Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					return fmt.Errorf("fetching %s/%d: %w", c.topic, p.Partition, err)
				}
				batches[p.Partition] = p.RecordBatches
			}
		}
	}
	for p := int32(0); p <= txnPartition; p++ {
		name := "txn"
		if p < txnPartition {
			name = codecs[p].name
		}
		b := batches[p]
		if len(b) == 0 {
			return fmt.Errorf("fetching %s/%d: no batches", c.topic, p)
		}
		if err := c.write("framework", "FuzzNextBatch", name, b, int64(0)); err != nil {
			return err
		}
		if err := c.write("framework", "FuzzNextBatch", name+"-from-7", b, int64(7)); err != nil {
			return err
		}
		if err := c.batchRecords(name, p, b); err != nil {
			return err
		}
	}
	return nil
}

// batchRecords stores each batch of a partition taken apart as
// FuzzBatchRecords takes its arguments: attributes, record count, last
// offset delta, and the (compressed) records.
func (c *capture) batchRecords(name string, p int32, b []byte) error {
	for i := 0; len(b) >= batchHeader; i++ {
		size := 12 + int(binary.BigEndian.Uint32(b[8:]))
		if size < batchHeader || size > len(b) {
			return fmt.Errorf("%s/%d: a batch of %d bytes in %d", c.topic, p, size, len(b))
		}
		batch := b[:size]
		b = b[size:]
		attrs := int16(binary.BigEndian.Uint16(batch[offAttrs:]))
		kind := "batch"
		if attrs&0x20 != 0 {
			kind = "control"
		}
		err := c.write("framework", "FuzzBatchRecords", fmt.Sprintf("%s-%s-%d", name, kind, i), attrs,
			int32(binary.BigEndian.Uint32(batch[offCount:])), int32(binary.BigEndian.Uint32(batch[offLastOff:])),
			bytes.Clone(batch[batchHeader:]))
		if err != nil {
			return err
		}
	}
	return nil
}

// readCommitted stores a read_committed Fetch response of the transactional
// partition, and its batches with the last stable offset and the aborted
// transaction it names as a FuzzReadCommitted entry.
func (c *capture) readCommitted(conn *rawConn) error {
	res, err := c.response(conn, "fetch-read-committed", fetchRequest(c.topic, 1, map[int32]int64{txnPartition: 0}))
	if err != nil {
		return err
	}
	p := res.(*kmsg.FetchResponse).Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
		return fmt.Errorf("fetching %s/%d read_committed: %w", c.topic, txnPartition, err)
	}
	if len(p.AbortedTransactions) != 1 {
		return fmt.Errorf("fetching %s/%d read_committed: %d aborted transactions, want 1", c.topic, txnPartition, len(p.AbortedTransactions))
	}
	a := p.AbortedTransactions[0]
	return c.write("framework", "FuzzReadCommitted", "txn", p.RecordBatches, int64(0), p.LastStableOffset, a.ProducerID, a.FirstOffset)
}
