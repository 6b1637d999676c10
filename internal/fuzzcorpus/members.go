package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	bolt "go.etcd.io/bbolt"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
)

// members runs a group of each protocol with a member of every client, and
// stores the member metadata and assignment the broker holds for each
// (DescribeGroups): what the engine's assignor reads from other clients.
//
// kafka-go's Reader writes version 1 of the subscription without the owned
// partitions version 1 has; a Java group leader fails on it ("Malformed
// consumer protocol subscription") and VerifiableConsumer ends. So the Java
// consumer joins a range group of its own, without kafka-go.
func (c *capture) members(ctx context.Context) error {
	for _, g := range []struct {
		proto         string
		kafkaGo, java bool
	}{
		{"range", true, false},
		{"range", false, true},
		{"cooperative-sticky", false, true},
	} {
		java := g.java && c.kafkaLocal != ""
		if g.java && !java && g.proto == "range" {
			continue // the first range group has the other members
		}
		if err := c.group(ctx, g.proto, g.kafkaGo, java); err != nil {
			return fmt.Errorf("%s group: %w", g.proto, err)
		}
	}
	return nil
}

func (c *capture) group(ctx context.Context, proto string, withKafkaGo, withJava bool) error {
	group := c.name(proto)
	label := proto
	if withJava {
		label += "-java"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var stops []func()
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}()
	want := 0

	// franz-go.
	bal := kgo.CooperativeStickyBalancer()
	if proto == "range" {
		bal = kgo.RangeBalancer()
	}
	kc, err := kgo.NewClient(kgo.SeedBrokers(c.seeds...), kgo.ClientID("franz-go"), kgo.ConsumerGroup(group),
		kgo.ConsumeTopics(c.topic), kgo.Balancers(bal))
	if err != nil {
		return err
	}
	kdone := make(chan struct{})
	go func() {
		defer close(kdone)
		for ctx.Err() == nil {
			kc.PollFetches(ctx)
		}
	}()
	stops = append(stops, func() { cancel(); <-kdone; kc.Close() })
	want++

	// kafka-go's Reader knows range and round-robin, not cooperative-sticky.
	if withKafkaGo {
		r := kafka.NewReader(kafka.ReaderConfig{
			Brokers: c.seeds, GroupID: group, Topic: c.topic,
			GroupBalancers: []kafka.GroupBalancer{kafka.RangeGroupBalancer{}},
			Dialer:         &kafka.Dialer{ClientID: "kafka-go", Timeout: 10 * time.Second},
			MaxWait:        200 * time.Millisecond,
		})
		rdone := make(chan struct{})
		go func() {
			defer close(rdone)
			for ctx.Err() == nil {
				if _, err := r.FetchMessage(ctx); err != nil && ctx.Err() == nil {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}()
		stops = append(stops, func() { cancel(); <-rdone; _ = r.Close() })
		want++
	}

	// tidemark, which offers both protocols.
	dir, err := os.MkdirTemp("", "fuzzcorpus-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	offsetFile := filepath.Join(dir, "o.db")
	tm, err := framework.New(framework.Config{
		Brokers: c.seeds, GroupID: group, Topics: []string{c.topic}, OffsetFile: offsetFile,
		Handler: handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }),
	})
	if err != nil {
		return err
	}
	tctx, tcancel := context.WithCancel(context.Background())
	tdone := make(chan error, 1)
	go func() { tdone <- tm.Run(tctx) }()
	var tmErr error
	stopTM := sync.OnceFunc(func() { tcancel(); tmErr = <-tdone })
	stops = append(stops, stopTM)
	want++

	// Kafka's Java client.
	if withJava {
		strategy := "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"
		if proto == "range" {
			strategy = "org.apache.kafka.clients.consumer.RangeAssignor"
		}
		cmd := exec.Command(c.kafkaLocal, "tool", "org.apache.kafka.tools.VerifiableConsumer",
			"--bootstrap-server", strings.Join(c.seeds, ","), "--topic", c.topic, "--group-id", group,
			"--group-protocol", "classic", "--assignment-strategy", strategy, "--verbose")
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("starting Kafka's VerifiableConsumer: %w", err)
		}
		stops = append(stops, func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
		})
		want++
	}

	adm, err := c.admin(ctx)
	if err != nil {
		return err
	}
	defer adm.Close()
	var members []kmsg.DescribeGroupsResponseGroupMember
	deadline := time.Now().Add(90 * time.Second)
	for {
		members, err = describe(ctx, adm, group, want)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("group %s: %w", group, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	seen := map[string]int{}
	for _, m := range members {
		client := clientName(m.ClientID)
		seen[client]++
		name := fmt.Sprintf("%s-%s", client, proto)
		if withJava && client != "java" {
			name += "-with-java"
		}
		if n := seen[client]; n > 1 {
			name = fmt.Sprintf("%s-%d", name, n)
		}
		if err := c.write("framework", "FuzzDecodeSubscription", name+"-metadata", m.ProtocolMetadata); err != nil {
			return err
		}
		if err := c.write("framework", "FuzzDecodeSubscription", name+"-assignment", m.MemberAssignment); err != nil {
			return err
		}
	}
	// tidemark's offset file, once it stopped: the records a real run
	// writes, for FuzzDecodeRecord.
	stopTM()
	if tmErr != nil {
		return fmt.Errorf("tidemark: %w", tmErr)
	}
	return c.offsetRecords(offsetFile, label)
}

// offsetRecords stores every partition record of an offset file
// (groups/GROUP/TOPIC/PARTITION) as a FuzzDecodeRecord entry.
func (c *capture) offsetRecords(path, proto string) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	defer db.Close()
	n := 0
	err = db.View(func(tx *bolt.Tx) error {
		groups := tx.Bucket([]byte("groups"))
		if groups == nil {
			return fmt.Errorf("%s: no groups bucket", path)
		}
		return groups.ForEachBucket(func(g []byte) error {
			return groups.Bucket(g).ForEachBucket(func(t []byte) error {
				return groups.Bucket(g).Bucket(t).ForEach(func(k, v []byte) error {
					n++
					return c.write("internal/offsetfile", "FuzzDecodeRecord", fmt.Sprintf("offsetfile-%s-%d", proto, n), bytes.Clone(v))
				})
			})
		})
	})
	if err == nil && n == 0 {
		err = fmt.Errorf("%s: no partition records", path)
	}
	return err
}

// describe returns the group's members once it is stable with want members,
// every one of them assigned something.
func describe(ctx context.Context, adm *kgo.Client, group string, want int) ([]kmsg.DescribeGroupsResponseGroupMember, error) {
	req := kmsg.NewPtrDescribeGroupsRequest()
	req.Groups = []string{group}
	res, err := req.RequestWith(ctx, adm)
	if err != nil {
		return nil, err
	}
	g := res.Groups[0]
	if g.State != "Stable" || len(g.Members) != want {
		return nil, fmt.Errorf("%s with %d members, want Stable with %d", g.State, len(g.Members), want)
	}
	for _, m := range g.Members {
		if len(m.MemberAssignment) == 0 {
			return nil, errors.New("member " + m.ClientID + " has no assignment yet")
		}
	}
	return g.Members, nil
}

func clientName(id string) string {
	switch {
	case strings.HasPrefix(id, "consumer-"):
		return "java"
	case id == "":
		return "unnamed"
	}
	return id
}
