package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/internal/testsupport"
)

// Environment of TestChaos.
const (
	// EnvDuration sets the fault phase ("2m" by default, "30s" with
	// -short; "20m" for a soak).
	EnvDuration = "TIDEMARK_CHAOS_DURATION"
	// EnvSeed replays a schedule or tries another (default: a fixed seed
	// per test and duration, logged; see chaosSeeds).
	EnvSeed = "TIDEMARK_CHAOS_SEED"
	// EnvStaticDuration sets the fault phase of TestChaosStatic ("60s" by
	// default, "20s" with -short).
	EnvStaticDuration = "TIDEMARK_CHAOS_STATIC_DURATION"
	// EnvKeyDuration sets the fault phase of TestChaosKey ("60s" by
	// default, "20s" with -short).
	EnvKeyDuration = "TIDEMARK_CHAOS_KEY_DURATION"
	// EnvStateDuration sets the fault phase of TestChaosState ("60s" by
	// default, "20s" with -short).
	EnvStateDuration = "TIDEMARK_CHAOS_STATE_DURATION"
	// EnvConsumerProtocolDuration sets the fault phase of
	// TestChaosConsumerProtocol ("60s" by default, "20s" with -short).
	EnvConsumerProtocolDuration = "TIDEMARK_CHAOS_CONSUMER_PROTOCOL_DURATION"
	// EnvSummary, when set, names a file the tests append their tables to,
	// so that CI can print the figures of a passing run.
	EnvSummary = "TIDEMARK_CHAOS_SUMMARY"
)

// TestChaos is the bounded chaos run: consumer processes killed,
// restarted, added and retired, commits delayed and failed, connections
// slowed, reset and blackholed, the broker restarted, under a steady
// producer; then nothing may be lost and every duplicate must have a cause
// the guarantees allow.
//
// The broker is the in-process kfake, or with KAFKA_BROKERS a real one: a
// broker of its own, started with $TIDEMARK_KAFKA_LOCAL when that is set
// (make test-kafka sets it), so that restarting it does not disturb the
// other packages' tests on the shared broker; otherwise the shared broker,
// which is then never restarted.
//
// The default runs are seeded (chaosSeeds) with schedules that inject every
// kind of fault; the test fails if one did not happen, or never acted on a
// request, or no partition moved cleanly between processes.
func TestChaos(t *testing.T) {
	runChaos(t, chaosRun{}, chaosDuration(t, EnvDuration, 2*time.Minute, 30*time.Second))
}

// TestChaosKey is TestChaos with OrderKey (Config.Keys): each partition's
// messages on DefaultKeys keys, up to KeyInFlight calls at once per
// partition, and the checker holds every process to per-key order. 60s,
// like TestChaosStatic.
func TestChaosKey(t *testing.T) {
	runChaos(t, chaosRun{keys: DefaultKeys}, chaosDuration(t, EnvKeyDuration, 60*time.Second, 20*time.Second))
}

// TestChaosConsumerProtocol is TestChaos with Kafka 4's consumer group
// protocol (Config.GroupProtocol "consumer", KIP-848): the broker assigns,
// each member reconciles on its own heartbeats, and the group's session
// and heartbeat interval are the broker's (set for the group to the
// classic run's). The same faults and the same checker: nothing lost,
// every duplicate with a cause the guarantees allow. 60s, like
// TestChaosStatic.
func TestChaosConsumerProtocol(t *testing.T) {
	runChaos(t, chaosRun{protocol: framework.GroupProtocolConsumer}, chaosDuration(t, EnvConsumerProtocolDuration, 60*time.Second, 20*time.Second))
}

// TestChaosState is TestChaos with state (Config.State): each consumer is
// a TxHandler counting every message in its partition's state, which a
// changelog carries to the partition's next owner. After the same faults
// (SIGKILLs among them), every offset file at a partition's log end holds
// exactly the log's count under each key: what was handled twice was
// applied once. 60s.
func TestChaosState(t *testing.T) {
	runChaos(t, chaosRun{state: true}, chaosDuration(t, EnvStateDuration, 60*time.Second, 20*time.Second))
}

// chaosRun is what a chaos test varies: static members, keys per
// partition under OrderKey (0: OrderPartition), the group protocol
// (empty: classic), state.
type chaosRun struct {
	static   bool
	keys     int
	protocol string
	state    bool
}

// chaosSeeds are the default seeds, per membership and fault-phase length:
// TestDefaultSeedsCoverEveryKind checks that their schedules, on either
// kind of broker, draw every kind of fault; a run whose length has no
// seed here (TIDEMARK_CHAOS_STATIC_DURATION, or TestChaosStatic with
// -short: 20s is too short for every kind) uses seed 1 and must inject
// every kind its schedule drew.
var chaosSeeds = map[bool]map[time.Duration]uint64{
	false: {2 * time.Minute: 1, 30 * time.Second: 7160, 60 * time.Second: 83},
	true:  {60 * time.Second: 26},
}

// TestChaosStatic is TestChaos with static members (Config.Static): every
// instance keeps its InstanceID across its restarts, so a restart within
// the session timeout gets its partitions back without a rebalance, and a
// stopped or retired member does not leave the group. It is shorter than
// TestChaos so that the package's tests stay near 3 minutes on 2 cores.
func TestChaosStatic(t *testing.T) {
	runChaos(t, chaosRun{static: true}, chaosDuration(t, EnvStaticDuration, 60*time.Second, 20*time.Second))
}

// chaosDuration is the fault phase: def, short with -short, or env.
func chaosDuration(t *testing.T, env string, def, short time.Duration) time.Duration {
	t.Helper()
	duration := def
	if testing.Short() {
		duration = short
	}
	if v := os.Getenv(env); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%s=%q: %v", env, v, err)
		}
		duration = d
	}
	return duration
}

// runChaos is one chaos run of duration, as cr says.
func runChaos(t *testing.T, cr chaosRun, duration time.Duration) {
	static, keys, protocol := cr.static, cr.keys, cr.protocol
	seed, cover := chaosSeeds[static][duration]
	if !cover {
		seed = 1
	}
	if v := os.Getenv(EnvSeed); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", EnvSeed, v, err)
		}
		seed, cover = s, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), duration+15*time.Minute)
	defer cancel()

	dir, err := os.MkdirTemp("", "tidemark-chaos-test-")
	if err != nil {
		t.Fatal(err)
	}
	keep := false
	defer func() {
		if keep {
			t.Logf("work directory kept: %s (re-check with: go run ./examples/chaos check -dir %s)", dir, dir)
		} else {
			_ = os.RemoveAll(dir)
		}
	}()
	bin := buildChaos(t, dir)

	out := &lineLogger{t: t}
	var broker Broker
	switch {
	case testsupport.RealBroker() && os.Getenv("TIDEMARK_KAFKA_LOCAL") != "":
		kdir := filepath.Join(dir, "kafka")
		if err := os.Mkdir(kdir, 0o755); err != nil {
			t.Fatal(err)
		}
		b, err := StartReal(ctx, os.Getenv("TIDEMARK_KAFKA_LOCAL"), kdir, out.logf)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := b.Close(); err != nil {
				t.Error(err)
			}
		}()
		broker = b
	case testsupport.RealBroker():
		broker = NewReal(strings.Split(os.Getenv(testsupport.EnvBrokers), ",")[0], "", "", out.logf)
	default:
		b, err := StartFake(filepath.Join(dir, "kfake"))
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		broker = b
	}
	t.Logf("chaos run: broker %s at %s, seed %d, %s of faults, %s, %s (replay: %s=%d)", broker.Name(), broker.Addr(), seed, duration, membership(static, protocol), ordering(keys), EnvSeed, seed)
	// Every kind of the mix is required from a default run; broker
	// restarts only where the broker can be restarted (the schedule then
	// differs, so only what it drew is required).
	var required []Kind
	if cover && broker.CanRestart() {
		for _, k := range Kinds {
			if DefaultMix()[k] > 0 {
				required = append(required, k)
			}
		}
	} else if cover {
		t.Logf("the broker at %s cannot be restarted: no broker restarts, and only the kinds the schedule draws are required", broker.Addr())
	}

	rep, err := Run(ctx, Config{
		Broker:          broker,
		ConsumerCommand: []string{bin, "consume"},
		Dir:             dir,
		Duration:        duration,
		Seed:            seed,
		Static:          static,
		Keys:            keys,
		GroupProtocol:   protocol,
		State:           cr.state,
		Out:             out,
	})
	if err != nil {
		keep = true
		t.Fatalf("the chaos run failed: %v", err)
	}
	var table bytes.Buffer
	rep.WriteTable(&table)
	t.Logf("\n%s", table.String())
	if path := os.Getenv(EnvSummary); path != "" {
		if f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err == nil {
			fmt.Fprintf(f, "%s\n", table.String())
			_ = f.Close()
		}
	}
	if rep.Failed() {
		keep = true
		t.Fatalf("promises broken (seed %d): %v", seed, rep.Violations)
	}
	// The run must have done what it is for.
	total := 0
	for _, n := range rep.Faults {
		total += n
	}
	if rep.Produced == 0 || rep.Consumed < rep.Expected || rep.Expected == 0 || total == 0 || rep.Handoffs == 0 ||
		rep.TxnCommitted == 0 || rep.TxnAborted == 0 {
		keep = true
		t.Fatalf("the run proved little: produced %d, consumed %d of the %d to handle (%d in the log), %d faults, %d hand-offs, transactional records %d committed and %d aborted",
			rep.Produced, rep.Consumed, rep.Expected, rep.InLog, total, rep.Handoffs, rep.TxnCommitted, rep.TxnAborted)
	}
	if cr.state && rep.StatesChecked < rep.Partitions {
		keep = true
		t.Fatalf("state checked in %d files at a partition's log end, want every one of the %d partitions", rep.StatesChecked, rep.Partitions)
	}
	if missing := rep.Uncovered(required, true); len(missing) > 0 {
		keep = true
		t.Fatalf("seed %d: the run did not do what it is for: %s", seed, strings.Join(missing, "; "))
	}
}

// buildChaos builds examples/chaos (without the race detector: the
// consumers are separate processes; the harness in this test is what -race
// checks) and returns the binary's path.
func buildChaos(t *testing.T, dir string) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the chaos test builds its consumer with the go tool: %v", err)
	}
	bin := filepath.Join(dir, "tidemark-chaos")
	cmd := exec.Command(goTool, "build", "-o", bin, "github.com/tidemark/tidemark/examples/chaos")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build examples/chaos: %v\n%s", err, out)
	}
	return bin
}

// lineLogger writes each line it is given to the test log.
type lineLogger struct {
	t   *testing.T
	mu  sync.Mutex
	buf []byte
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.t.Log(string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

func (l *lineLogger) logf(format string, args ...any) { fmt.Fprintf(l, format+"\n", args...) }
