package framework_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// startConsumer runs a consumer of a fresh 2-partition topic holding n/2
// messages in each partition (testsupport.Start: the in-process broker, or
// KAFKA_BROKERS), with the inspect socket set to socket, until the test
// ends or Stop is called; it returns the topic and the group.
func startConsumer(t *testing.T, file, socket string, n int) (r *frameworktest.Running, rec *testsupport.Recorder, topic, group string) {
	t.Helper()
	cl := testsupport.Start(t)
	topic, group = cl.FixedName(t, "orders"), cl.FixedName(t, "billing")
	cl.CreateTopic(t, topic, 2)
	cl.Produce(t, topic, 2, 0, n/2)
	rec = &testsupport.Recorder{}
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, rec)
	cfg.InspectSocket = socket
	return frameworktest.Start(t, cfg), rec, topic, group
}

func TestInspectServesSnapshot(t *testing.T) {
	for _, socket := range []string{"", "tcp:127.0.0.1:0"} {
		t.Run("socket="+socket, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "offsets.db")
			r, rec, topic, group := startConsumer(t, file, socket, 10)
			testsupport.WaitFor(t, 20*time.Second, "10 messages handled", func() bool { return rec.Count() == 10 })

			ep, err := inspect.ReadEndpoint(file)
			if err != nil {
				t.Fatal(err)
			}
			wantNet := map[string]string{"": "unix", "tcp:127.0.0.1:0": "tcp"}[socket]
			if ep.Pid != os.Getpid() || ep.Network != wantNet || len(ep.Token) != 32 || ep.OffsetFile != file {
				t.Errorf("endpoint %+v", ep)
			}
			if fi, err := os.Stat(file + inspect.SideFileSuffix); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("side file: %v, %v; want mode 0600", fi, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var snap *snapshot
			testsupport.WaitFor(t, 20*time.Second, "durable watermarks 5 and 5", func() bool {
				snap, err = inspect.Fetch[framework.Stats](ctx, ep, true)
				if err != nil {
					t.Fatal(err)
				}
				return len(snap.Records) == 2 && snap.Records[0].Watermark == 5 && snap.Records[1].Watermark == 5
			})
			if snap.Pid != os.Getpid() || snap.Stats.Group != group || len(snap.Stats.Partitions) != 2 ||
				snap.Stats.Partitions[0].Processed != 5 || snap.Records[0].Group != group || snap.Records[0].Topic != topic {
				t.Errorf("snapshot %+v", snap)
			}

			// Without the token: refused.
			bad := *ep
			bad.Token = "wrong"
			if _, err := inspect.Fetch[framework.Stats](ctx, &bad, false); err == nil || !strings.Contains(err.Error(), "401") {
				t.Errorf("snapshot with a wrong token: %v, want 401", err)
			}

			r.Stop(t)
			if _, err := inspect.ReadEndpoint(file); !errors.Is(err, inspect.ErrNoEndpoint) {
				t.Errorf("side file after Run returned: %v", err)
			}
			if _, err := os.Stat(file + inspect.SocketSuffix); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("socket after Run returned: %v", err)
			}
			if _, err := inspect.Fetch[framework.Stats](ctx, ep, false); err == nil {
				t.Error("snapshot after Run returned succeeded")
			}
		})
	}
}

func TestInspectDisabled(t *testing.T) {
	file := filepath.Join(t.TempDir(), "offsets.db")
	_, rec, _, _ := startConsumer(t, file, framework.InspectDisabled, 2)
	testsupport.WaitFor(t, 20*time.Second, "2 messages handled", func() bool { return rec.Count() == 2 })
	if _, err := inspect.ReadEndpoint(file); !errors.Is(err, inspect.ErrNoEndpoint) {
		t.Errorf("side file with InspectSocket %q: %v", framework.InspectDisabled, err)
	}
}

// A socket left behind by a crashed run is replaced; a stale side file is
// overwritten.
func TestInspectReplacesStaleSocket(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "offsets.db")
	sock := filepath.Join(dir, "custom.sock")
	if err := os.WriteFile(file+inspect.SideFileSuffix, []byte(`{"version":1,"pid":1,"network":"unix","address":"/nonexistent"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	// A listener whose socket file outlives it, as after SIGKILL.
	if err := stale(sock); err != nil {
		t.Fatal(err)
	}
	_, rec, _, _ := startConsumer(t, file, sock, 2)
	testsupport.WaitFor(t, 20*time.Second, "2 messages handled", func() bool { return rec.Count() == 2 })
	ep, err := inspect.ReadEndpoint(file)
	if err != nil || ep.Address != sock || ep.Pid != os.Getpid() {
		t.Fatalf("endpoint %+v, %v", ep, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := inspect.Fetch[framework.Stats](ctx, ep, false); err != nil {
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

// A running TxHandler consumer serves its partitions' state sizes beside
// its snapshot (inspect.StatePath), which the command shows live.
func TestInspectServesStateSizes(t *testing.T) {
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, 2)
	cl.Produce(t, topic, 2, 0, 10)
	file := filepath.Join(t.TempDir(), "offsets.db")
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, nil)
	cfg.Handler, cfg.InspectSocket = nil, "" // the default socket
	cfg.TxHandler = handler.TxHandlerFunc(func(_ context.Context, st handler.State, msgs []kafka.Message) error {
		for _, m := range msgs {
			if err := st.Put([]byte{byte('a' + m.Offset%3)}, []byte("value")); err != nil {
				return err
			}
		}
		return nil
	})
	r := frameworktest.Start(t, cfg)
	var ep *inspect.Endpoint
	var err error
	testsupport.WaitFor(t, 10*time.Second, "the inspect side file", func() bool {
		ep, err = inspect.ReadEndpoint(file)
		return err == nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var sizes *inspect.StateSizes
	testsupport.WaitFor(t, 20*time.Second, "both partitions' 3 keys durable", func() bool {
		if sizes, err = inspect.FetchStateSizes(ctx, ep); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, p := range sizes.Partitions {
			if p.Keys == 3 && p.Bytes > 0 {
				n++
			}
		}
		return n == 2
	})
	if sizes.Format != inspect.StateFormat || sizes.Partitions[0].Key.Group != group || sizes.Partitions[0].Key.Topic != topic {
		t.Errorf("state sizes %+v", sizes)
	}
	r.Stop(t)
}
