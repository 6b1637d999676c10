package framework_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
)

// startOnKfake runs a consumer of a fresh 2-partition topic with n messages
// on an in-process broker, until the returned stop is called.
func startOnKfake(t *testing.T, file, socket string, n int) (c *framework.Consumer, handled *atomic.Int64, stop func()) {
	t.Helper()
	broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(broker.Close)
	addr := broker.ListenAddrs()[0]
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{Addr: kafka.TCP(addr), Topic: "orders", Balancer: &kafka.RoundRobin{}, BatchTimeout: time.Millisecond, Transport: tr}
	for i := range n {
		if err := w.WriteMessages(context.Background(), kafka.Message{Value: fmt.Appendf(nil, "m%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	_ = w.Close()
	handled = new(atomic.Int64)
	c, err = framework.New(framework.Config{
		Brokers:           []string{addr},
		GroupID:           "billing",
		Topics:            []string{"orders"},
		OffsetFile:        file,
		InspectSocket:     socket,
		CommitInterval:    50 * time.Millisecond,
		HeartbeatInterval: 300 * time.Millisecond,
		FetchMaxWait:      100 * time.Millisecond,
		Handler: handler.HandlerFunc(func(context.Context, kafka.Message) error {
			handled.Add(1)
			return nil
		}),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("Run did not return")
		}
	}
	t.Cleanup(stop)
	return c, handled, stop
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestInspectServesSnapshot(t *testing.T) {
	for _, socket := range []string{"", "tcp:127.0.0.1:0"} {
		t.Run("socket="+socket, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "offsets.db")
			_, handled, stop := startOnKfake(t, file, socket, 10)
			waitUntil(t, "10 messages handled", func() bool { return handled.Load() == 10 })

			ep, err := framework.ReadInspectEndpoint(file)
			if err != nil {
				t.Fatal(err)
			}
			wantNet := map[string]string{"": "unix", "tcp:127.0.0.1:0": "tcp"}[socket]
			if ep.Pid != os.Getpid() || ep.Network != wantNet || len(ep.Token) != 32 || ep.OffsetFile != file {
				t.Errorf("endpoint %+v", ep)
			}
			if fi, err := os.Stat(file + framework.InspectSideFileSuffix); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("side file: %v, %v; want mode 0600", fi, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var snap *framework.InspectSnapshot
			waitUntil(t, "durable watermarks 5 and 5", func() bool {
				snap, err = ep.Snapshot(ctx, true)
				if err != nil {
					t.Fatal(err)
				}
				return len(snap.Records) == 2 && snap.Records[0].Watermark == 5 && snap.Records[1].Watermark == 5
			})
			if snap.Pid != os.Getpid() || snap.Stats.Group != "billing" || len(snap.Stats.Partitions) != 2 ||
				snap.Stats.Partitions[0].Processed != 5 || snap.Records[0].Group != "billing" || snap.Records[0].Topic != "orders" {
				t.Errorf("snapshot %+v", snap)
			}

			// Without the token: refused.
			bad := *ep
			bad.Token = "wrong"
			if _, err := bad.Snapshot(ctx, false); err == nil || !strings.Contains(err.Error(), "401") {
				t.Errorf("snapshot with a wrong token: %v, want 401", err)
			}

			stop()
			if _, err := framework.ReadInspectEndpoint(file); !errors.Is(err, framework.ErrNoInspectEndpoint) {
				t.Errorf("side file after Run returned: %v", err)
			}
			if _, err := os.Stat(file + framework.InspectSocketSuffix); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("socket after Run returned: %v", err)
			}
			if _, err := ep.Snapshot(ctx, false); err == nil {
				t.Error("snapshot after Run returned succeeded")
			}
		})
	}
}

func TestInspectDisabled(t *testing.T) {
	file := filepath.Join(t.TempDir(), "offsets.db")
	_, handled, _ := startOnKfake(t, file, framework.InspectDisabled, 2)
	waitUntil(t, "2 messages handled", func() bool { return handled.Load() == 2 })
	if _, err := framework.ReadInspectEndpoint(file); !errors.Is(err, framework.ErrNoInspectEndpoint) {
		t.Errorf("side file with InspectSocket %q: %v", framework.InspectDisabled, err)
	}
}

// A socket left behind by a crashed run is replaced; a stale side file is
// overwritten.
func TestInspectReplacesStaleSocket(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "offsets.db")
	sock := filepath.Join(dir, "custom.sock")
	if err := os.WriteFile(file+framework.InspectSideFileSuffix, []byte(`{"version":1,"pid":1,"network":"unix","address":"/nonexistent"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// A listener whose socket file outlives it, as after SIGKILL.
	if err := stale(sock); err != nil {
		t.Fatal(err)
	}
	_, handled, _ := startOnKfake(t, file, sock, 2)
	waitUntil(t, "2 messages handled", func() bool { return handled.Load() == 2 })
	ep, err := framework.ReadInspectEndpoint(file)
	if err != nil || ep.Address != sock || ep.Pid != os.Getpid() {
		t.Fatalf("endpoint %+v, %v", ep, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := ep.Snapshot(ctx, false); err != nil {
		t.Fatal(err)
	}
}

func TestInspectSocketValidation(t *testing.T) {
	for _, bad := range []string{"tcp:10.1.2.3:80", "tcp:nonsense", "tcp:example.com:1", "/" + strings.Repeat("x", 200)} {
		_, err := framework.New(framework.Config{
			Brokers: []string{"127.0.0.1:1"}, GroupID: "g", Topics: []string{"t"},
			OffsetFile: filepath.Join(t.TempDir(), "offsets.db"), InspectSocket: bad,
			Handler: handler.HandlerFunc(func(context.Context, kafka.Message) error { return nil }),
		})
		var ce *framework.ConfigError
		if !errors.As(err, &ce) || ce.Field != "InspectSocket" {
			t.Errorf("InspectSocket %q: %v, want a ConfigError", bad, err)
		}
	}
}

// stale leaves a unix socket file at path that nobody listens on.
func stale(path string) error {
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return err
	}
	l.SetUnlinkOnClose(false)
	return l.Close()
}
