package wire

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// countingConn counts the Read calls on a connection.
type countingConn struct {
	net.Conn
	reads int
}

func (c *countingConn) Read(b []byte) (int, error) {
	c.reads++
	return c.Conn.Read(b)
}

// A small response is read in one read, its size and header with its body:
// reading them apart cost a read(2) per response more than franz-go (at
// 400 msgs/s, 6% more syscalls than the rest of the consumer). Fetch
// responses (read by fields, fetchstream.go) and the others alike.
func TestConnReadsASmallResponseAtOnce(t *testing.T) {
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "t"))
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	ctx := context.Background()
	c, err := Dial(ctx, fake.ListenAddrs()[0], &Options{ClientID: "test", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	counted := &countingConn{Conn: c.nc}
	c.nc, c.br = counted, nil
	const n = 50
	for range n {
		if _, err := c.Do(ctx, kmsg.NewPtrMetadataRequest(), 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	meta := counted.reads
	counted.reads = 0
	for range n {
		req := kmsg.NewPtrFetchRequest()
		req.MaxBytes = 1 << 20
		tr := kmsg.NewFetchRequestTopic()
		tr.Topic = "t"
		pr := kmsg.NewFetchRequestTopicPartition()
		pr.PartitionMaxBytes = 1 << 20
		tr.Partitions = append(tr.Partitions, pr)
		req.Topics = append(req.Topics, tr)
		if _, err := c.Do(ctx, req, 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	// A response the broker's socket split in two takes two reads: a few
	// of 50 may, on a busy machine; reading the size apart takes 2 each.
	if meta > n+n/10 || counted.reads > n+n/10 {
		t.Errorf("%d reads for %d Metadata responses, %d for %d Fetch responses; want about one each", meta, n, counted.reads, n)
	}
}
