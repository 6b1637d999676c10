package chaos

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Broker is the Kafka broker of a run: the in-process kfake or a real one.
// Its address stays the same across restarts.
type Broker interface {
	// Name is "kfake" or "kafka".
	Name() string
	// Addr is the broker's "host:port".
	Addr() string
	// CanRestart reports whether Restart is possible.
	CanRestart() bool
	// Restart stops the broker (abruptly if kill, where the broker
	// supports it), keeps it down for about down, and starts it again on
	// the same address with the same data. It returns once the broker
	// listens again.
	Restart(ctx context.Context, kill bool, down time.Duration) error
	// Close stops the broker if the run owns it.
	Close() error
}

// FakeBroker is the in-process kfake broker with a fixed port and a data
// directory, so that a restart (Close, then a new cluster on the same port
// and directory) keeps topics, records and committed offsets. kfake saves
// its state when closed, so every restart is a clean shutdown: kill is
// ignored.
type FakeBroker struct {
	port int
	dir  string

	mu sync.Mutex
	cl *kfake.Cluster
}

// StartFake starts a single-broker kfake cluster on a free loopback port,
// persisting its state in dir.
func StartFake(dir string) (*FakeBroker, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos: finding a free port for kfake: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	if err := ln.Close(); err != nil {
		return nil, fmt.Errorf("chaos: finding a free port for kfake: %w", err)
	}
	b := &FakeBroker{port: port, dir: dir}
	cl, err := b.newCluster()
	if err != nil {
		return nil, err
	}
	b.cl = cl
	return b, nil
}

func (b *FakeBroker) newCluster() (*kfake.Cluster, error) {
	// kfake takes a consumer-protocol group's heartbeat interval from its
	// broker config only (not the group's, which Run sets).
	cl, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(b.port), kfake.DataDir(b.dir),
		kfake.BrokerConfigs(map[string]string{"group.consumer.heartbeat.interval.ms": fmt.Sprint(HeartbeatInterval.Milliseconds())}))
	if err != nil {
		return nil, fmt.Errorf("chaos: starting kfake on 127.0.0.1:%d with data in %s: %w", b.port, b.dir, err)
	}
	return cl, nil
}

// Name implements Broker.
func (b *FakeBroker) Name() string { return "kfake" }

// Addr implements Broker.
func (b *FakeBroker) Addr() string { return fmt.Sprintf("127.0.0.1:%d", b.port) }

// CanRestart implements Broker.
func (b *FakeBroker) CanRestart() bool { return true }

// Restart implements Broker. The port is retried for a few seconds, as the
// closed listener may take a moment to release it.
func (b *FakeBroker) Restart(ctx context.Context, _ bool, down time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cl != nil {
		b.cl.Close()
		b.cl = nil
	}
	if !sleepCtx(ctx, down) {
		return ctx.Err()
	}
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		var cl *kfake.Cluster
		if cl, err = b.newCluster(); err == nil {
			b.cl = cl
			return nil
		}
		if !sleepCtx(ctx, 100*time.Millisecond) {
			return ctx.Err()
		}
	}
	return err
}

// Close implements Broker.
func (b *FakeBroker) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cl != nil {
		b.cl.Close()
		b.cl = nil
	}
	return nil
}

// RealBroker is a real Apache Kafka broker. With the path of
// scripts/kafka-local and the broker's directory it can be restarted
// (`kafka-local restart [--kill] --dir DIR`); without them it cannot.
type RealBroker struct {
	addr   string
	script string // scripts/kafka-local, or ""
	dir    string // the broker's kafka-local directory, or ""
	// owned: Close stops the broker (started by StartReal).
	owned bool
	// logf receives the script's output of each restart.
	logf func(format string, args ...any)
}

// NewReal uses the broker at addr; script and dir, when both set, allow
// restarts. Close does not stop it.
func NewReal(addr, script, dir string, logf func(string, ...any)) *RealBroker {
	return &RealBroker{addr: addr, script: script, dir: dir, logf: logf}
}

// StartReal starts a fresh broker of its own with `script start --dir dir
// --owner PID`; Close stops it. With --owner, the script also stops it
// (restarts included) once this process has exited, however it ended: a
// test binary panicking at go test's -timeout runs no deferred Close.
func StartReal(ctx context.Context, script, dir string, logf func(string, ...any)) (*RealBroker, error) {
	owner := strconv.Itoa(os.Getpid())
	out, err := runScript(ctx, script, "start", "--dir", dir, "--owner", owner)
	if err != nil {
		return nil, fmt.Errorf("chaos: %s start --dir %s --owner %s: %w\n%s", script, dir, owner, err, out)
	}
	addr := ""
	for _, line := range bytes.Split(out, []byte("\n")) {
		if v, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("KAFKA_BROKERS=")); ok {
			addr = string(v)
		}
	}
	if addr == "" {
		return nil, fmt.Errorf("chaos: %s start printed no KAFKA_BROKERS line:\n%s", script, out)
	}
	return &RealBroker{addr: addr, script: script, dir: dir, owned: true, logf: logf}, nil
}

// Name implements Broker.
func (b *RealBroker) Name() string { return "kafka" }

// Addr implements Broker.
func (b *RealBroker) Addr() string { return b.addr }

// CanRestart implements Broker.
func (b *RealBroker) CanRestart() bool { return b.script != "" && b.dir != "" }

// Restart implements Broker: `kafka-local restart [--kill] --dir DIR`,
// which waits until the broker answers again. down is not used: the real
// broker's own stop and start take seconds.
func (b *RealBroker) Restart(ctx context.Context, kill bool, _ time.Duration) error {
	if !b.CanRestart() {
		return fmt.Errorf("chaos: the broker at %s cannot be restarted (no kafka-local script and directory)", b.addr)
	}
	args := []string{"restart", "--dir", b.dir}
	if kill {
		args = append(args, "--kill")
	}
	out, err := runScript(ctx, b.script, args...)
	if b.logf != nil {
		b.logf("%s", bytes.TrimSpace(out))
	}
	if err != nil {
		return fmt.Errorf("chaos: %s %v: %w", b.script, args, err)
	}
	return nil
}

// Close implements Broker: it stops the broker only if StartReal started
// it.
func (b *RealBroker) Close() error {
	if !b.owned {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := runScript(ctx, b.script, "stop", "--dir", b.dir); err != nil {
		return fmt.Errorf("chaos: %s stop --dir %s: %w\n%s", b.script, b.dir, err, out)
	}
	return nil
}

// runScript runs the kafka-local script and returns its combined output.
// The script dies with this process (on Linux), so that a restart under way
// cannot launch a broker after the --owner watcher stopped the broker; start
// is the exception: it completes and leaves its broker to that watcher.
func runScript(ctx context.Context, script string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, script, args...)
	if args[0] != "start" {
		setParentDeath(cmd)
	}
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	cmd.Stdin = nil
	cmd.Env = os.Environ()
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	return out.Bytes(), err
}

// sleepCtx waits d or until ctx ends, reporting whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
