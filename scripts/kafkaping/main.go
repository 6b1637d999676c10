// Command kafkaping is a helper for scripts/kafka-local. It is not part of
// the tidemark library.
//
//	kafkaping -brokers 127.0.0.1:9092 -timeout 60s   # wait until a Metadata request answers
//	kafkaping -brokers 127.0.0.1:9092 -smoke          # also create a topic, produce, consume in a group, commit, check the commit
//	kafkaping -free-ports 2                           # print N free TCP ports on 127.0.0.1, one a line
//
// Exit status is 0 on success and 1 otherwise; diagnostics go to stderr.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

func main() {
	brokers := flag.String("brokers", os.Getenv("KAFKA_BROKERS"), "comma-separated broker addresses (default $KAFKA_BROKERS)")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after this long")
	smoke := flag.Bool("smoke", false, "after Metadata answers, create a topic, produce, consume with a group, commit and verify the committed offset")
	freePorts := flag.Int("free-ports", 0, "print this many free TCP ports on 127.0.0.1 and exit")
	quiet := flag.Bool("q", false, "print nothing on success")
	flag.Parse()

	if *freePorts > 0 {
		if err := printFreePorts(*freePorts); err != nil {
			fail(err)
		}
		return
	}
	if *brokers == "" {
		fail(errors.New("no brokers: pass -brokers or set KAFKA_BROKERS"))
	}
	addrs := strings.Split(*brokers, ",")

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	start := time.Now()
	md, err := waitMetadata(ctx, addrs[0])
	if err != nil {
		fail(fmt.Errorf("metadata from %s: %w", addrs[0], err))
	}
	if !*quiet {
		ids := make([]string, 0, len(md.Brokers))
		for _, b := range md.Brokers {
			ids = append(ids, fmt.Sprintf("%d@%s:%d", b.ID, b.Host, b.Port))
		}
		fmt.Printf("kafkaping: metadata ok after %s: brokers=[%s] controller=%d topics=%d\n",
			time.Since(start).Round(time.Millisecond), strings.Join(ids, " "), md.Controller.ID, len(md.Topics))
	}
	if !*smoke {
		return
	}
	if err := smokeTest(ctx, addrs, *quiet); err != nil {
		fail(fmt.Errorf("smoke: %w", err))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "kafkaping:", err)
	os.Exit(1)
}

// printFreePorts binds n listeners on 127.0.0.1:0 at the same time (so the
// ports differ), prints their ports and releases them.
func printFreePorts(n int) error {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		ls = append(ls, l)
	}
	for _, l := range ls {
		fmt.Println(l.Addr().(*net.TCPAddr).Port)
	}
	return nil
}

// waitMetadata retries a Metadata request until the broker answers with at
// least one broker, or ctx ends.
func waitMetadata(ctx context.Context, addr string) (*kafka.MetadataResponse, error) {
	client := &kafka.Client{Addr: kafka.TCP(addr), Timeout: 5 * time.Second}
	var lastErr error
	for {
		attemptCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		md, err := client.Metadata(attemptCtx, &kafka.MetadataRequest{})
		cancel()
		if err == nil && len(md.Brokers) > 0 {
			return md, nil
		}
		if err == nil {
			err = errors.New("metadata answered with no brokers")
		}
		lastErr = err
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last error: %v)", ctx.Err(), lastErr)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func smokeTest(ctx context.Context, addrs []string, quiet bool) error {
	logf := func(format string, args ...any) {
		if !quiet {
			fmt.Printf("kafkaping: "+format+"\n", args...)
		}
	}
	suffix := time.Now().UnixNano()
	topic := fmt.Sprintf("kafkaping-smoke-%d", suffix)
	group := fmt.Sprintf("kafkaping-group-%d", suffix)
	client := &kafka.Client{Addr: kafka.TCP(addrs...), Timeout: 10 * time.Second}

	t0 := time.Now()
	ct, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{
		Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}},
	})
	if err != nil {
		return fmt.Errorf("create topic: %w", err)
	}
	if err := ct.Errors[topic]; err != nil {
		return fmt.Errorf("create topic %s: %w", topic, err)
	}
	logf("created topic %s (%s)", topic, time.Since(t0).Round(time.Millisecond))

	const n = 3
	t0 = time.Now()
	w := &kafka.Writer{
		Addr:         kafka.TCP(addrs...),
		Topic:        topic,
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: 10 * time.Millisecond,
	}
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("v%d", i))}
	}
	// The new topic's leader may need a moment to be known everywhere.
	for {
		err = w.WriteMessages(ctx, msgs...)
		if err == nil || ctx.Err() != nil {
			break
		}
		logf("produce retry: %v", err)
		time.Sleep(250 * time.Millisecond)
	}
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	logf("produced %d messages (%s)", n, time.Since(t0).Round(time.Millisecond))

	t0 = time.Now()
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:        addrs,
		GroupID:        group,
		Topic:          topic,
		StartOffset:    kafka.FirstOffset,
		SessionTimeout: 6 * time.Second,
		MaxWait:        250 * time.Millisecond,
	})
	defer r.Close()
	var last kafka.Message
	for i := 0; i < n; i++ {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			return fmt.Errorf("consume message %d: %w", i, err)
		}
		if want := fmt.Sprintf("v%d", i); string(m.Value) != want {
			return fmt.Errorf("message %d: got value %q, want %q", i, m.Value, want)
		}
		last = m
	}
	if err := r.CommitMessages(ctx, last); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	logf("consumed %d messages in group %s and committed offset %d (%s)", n, group, last.Offset+1, time.Since(t0).Round(time.Millisecond))

	of, err := client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: {0}}})
	if err != nil {
		return fmt.Errorf("offset fetch: %w", err)
	}
	if of.Error != nil {
		return fmt.Errorf("offset fetch: %w", of.Error)
	}
	parts := of.Topics[topic]
	if len(parts) != 1 {
		return fmt.Errorf("offset fetch: got %d partitions for %s, want 1", len(parts), topic)
	}
	if parts[0].Error != nil {
		return fmt.Errorf("offset fetch partition 0: %w", parts[0].Error)
	}
	if parts[0].CommittedOffset != n {
		return fmt.Errorf("offset fetch: committed offset %d, want %d", parts[0].CommittedOffset, n)
	}
	logf("offset fetch: group %s topic %s partition 0 committed offset %d", group, topic, parts[0].CommittedOffset)
	fmt.Printf("kafkaping: smoke ok topic=%s group=%s\n", topic, group)
	return nil
}
