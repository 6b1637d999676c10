package metrics_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/metrics"
)

// Consume a topic from an in-process broker, then scrape the consumer's
// metrics as Prometheus would, and print what it handled per partition.
func ExampleHandler() {
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"))
	if err != nil {
		panic(err)
	}
	defer broker.Close()
	addr := broker.ListenAddrs()[0]
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: "orders", Balancer: &kafka.RoundRobin{}, BatchTimeout: time.Millisecond, Transport: tr}
	for i := 0; i < 10; i++ {
		if err := w.WriteMessages(context.Background(), kafka.Message{Value: fmt.Appendf(nil, "order %d", i)}); err != nil {
			panic(err)
		}
	}
	_ = w.Close()

	dir, _ := os.MkdirTemp("", "tidemark-example")
	defer os.RemoveAll(dir)
	ctx, stop := context.WithCancel(context.Background())
	var mu sync.Mutex
	handled := 0
	c, err := framework.New(framework.Config{
		Brokers:    []string{addr},
		GroupID:    "billing",
		Topics:     []string{"orders"},
		OffsetFile: filepath.Join(dir, "offsets.db"),
		Handler: handler.HandlerFunc(func(ctx context.Context, m kafka.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if handled++; handled == 10 {
				stop()
			}
			return nil
		}),
	})
	if err != nil {
		panic(err)
	}
	// A service mounts it: http.Handle("/metrics", metrics.Handler(c)).
	srv := httptest.NewServer(metrics.Handler(c))
	defer srv.Close()
	if err := c.Run(ctx); err != nil {
		panic(err)
	}

	res, err := srv.Client().Get(srv.URL)
	if err != nil {
		panic(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "tidemark_handled_messages_total") {
			fmt.Println(line)
		}
	}
	// Output:
	// tidemark_handled_messages_total{group="billing",topic="orders",partition="0"} 5
	// tidemark_handled_messages_total{group="billing",topic="orders",partition="1"} 5
}

// Register a Collector in a registry of your own, beside other metrics.
func ExampleNewCollector() {
	dir, _ := os.MkdirTemp("", "tidemark-example")
	defer os.RemoveAll(dir)
	c, err := framework.New(framework.Config{
		Brokers:    []string{"127.0.0.1:9092"}, // New makes no network call
		GroupID:    "billing",
		Topics:     []string{"orders"},
		OffsetFile: filepath.Join(dir, "offsets.db"),
		Handler:    handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }),
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	col, err := metrics.NewCollector(c)
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col) // prometheus.MustRegister(col) for the default registry
	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		if f.GetName() == "tidemark_partitions" {
			for _, m := range f.GetMetric() {
				if m.GetLabel()[1].GetValue() == "running" {
					fmt.Printf("%s{state=%q} %v\n", f.GetName(), m.GetLabel()[1].GetValue(), m.GetGauge().GetValue())
				}
			}
		}
	}
	// Output:
	// tidemark_partitions{state="running"} 0
}
