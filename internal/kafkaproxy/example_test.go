package kafkaproxy_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/internal/kafkaproxy"
)

// A client bootstrapped through the proxy stays on it, and a Fail rule makes
// its offset commits fail until the rule is removed.
func ExampleProxy_Fail() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cluster.Close()
	px, err := kafkaproxy.New(cluster.ListenAddrs()[0])
	if err != nil {
		fmt.Println(err)
		return
	}
	defer px.Close()
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(px.Addr()), Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	md, err := client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{"orders"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	b := md.Brokers[0]
	fmt.Println("broker is the proxy:", net.JoinHostPort(b.Host, strconv.Itoa(b.Port)) == px.Addr())

	commit := func(offset int64) error {
		res, err := client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{
			GroupID: "billing", GenerationID: -1,
			Topics: map[string][]kafka.OffsetCommit{"orders": {{Partition: 0, Offset: offset}}},
		})
		if err != nil {
			return err
		}
		return res.Topics["orders"][0].Error
	}
	rule, err := px.Fail(kmsg.OffsetCommit, 16) // NOT_COORDINATOR
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("with rule:", errors.Is(commit(1), kafka.NotCoordinatorForGroup))
	rule.Remove()
	fmt.Println("after Remove:", commit(1))
	fmt.Printf("OffsetCommit counts: %+v\n", px.Counts(kmsg.OffsetCommit))
	// Output:
	// broker is the proxy: true
	// with rule: true
	// after Remove: <nil>
	// OffsetCommit counts: {Seen:2 Forwarded:1 Delayed:0 Failed:1 Reset:0}
}
