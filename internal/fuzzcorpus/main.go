// Command fuzzcorpus writes seed corpora for the fuzz tests from what a real
// broker and real clients send: record batches (plain, compressed with each
// codec, with headers, transactional with a commit and an abort, so control
// batches too), every response the engine reads at its pinned version, and
// the group member metadata and assignments franz-go, kafka-go and
// (with -kafka-local) Kafka's Java client write.
//
//	go run ./internal/fuzzcorpus                        # the in-process kfake broker
//	scripts/kafka-local run -- go run ./internal/fuzzcorpus -kafka-local scripts/kafka-local
//
// Against $KAFKA_BROKERS when set. Files go to testdata/fuzz/FuzzX/SOURCE-NAME
// under each fuzz test's package, SOURCE being kfake or kafka-VERSION; a run
// first removes its source's files, so that running again replaces them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "fuzzcorpus:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("fuzzcorpus", flag.ContinueOnError)
	brokers := fs.String("brokers", os.Getenv("KAFKA_BROKERS"), "broker host:port[,host:port]; empty: an in-process kfake broker")
	root := fs.String("root", ".", "the repository's root: corpus files go under its packages' testdata/fuzz")
	kafkaLocal := fs.String("kafka-local", "", "scripts/kafka-local, to run Kafka's Java VerifiableConsumer as a group member; empty: no Java member")
	source := fs.String("source", "", "file name prefix; empty: kfake, or kafka-$TIDEMARK_KAFKA_VERSION on a real broker")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	seeds := strings.Split(*brokers, ",")
	src := *source
	if *brokers == "" {
		fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(time.Second))
		if err != nil {
			return err
		}
		defer fake.Close()
		seeds = fake.ListenAddrs()
		if src == "" {
			src = "kfake"
		}
	} else if src == "" {
		v := os.Getenv("TIDEMARK_KAFKA_VERSION")
		if v == "" {
			return errors.New("-source: name the broker (or set TIDEMARK_KAFKA_VERSION)")
		}
		src = "kafka-" + v
	}
	c := &capture{seeds: seeds, root: *root, source: src, kafkaLocal: *kafkaLocal, run: time.Now().UnixNano() % 1e9}
	if err := c.clear(); err != nil {
		return err
	}
	if err := c.records(ctx); err != nil {
		return fmt.Errorf("records: %w", err)
	}
	if err := c.responses(ctx); err != nil {
		return fmt.Errorf("responses: %w", err)
	}
	if err := c.consumerProtocol(ctx); err != nil {
		return fmt.Errorf("consumer group protocol: %w", err)
	}
	if err := c.members(ctx); err != nil {
		return fmt.Errorf("member metadata: %w", err)
	}
	fmt.Printf("fuzzcorpus: %d files written from %s (%s)\n", c.written, src, strings.Join(seeds, ","))
	return nil
}

// capture is one run.
type capture struct {
	seeds      []string
	root       string
	source     string
	kafkaLocal string
	run        int64 // makes topic and group names unique on a shared broker
	written    int

	topic string // the records topic
}

func (c *capture) name(kind string) string { return fmt.Sprintf("fuzzcorpus-%s-%d", kind, c.run) }
