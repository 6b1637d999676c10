// Command kubernetes is a tidemark service as statefulset.yaml runs it:
// one pod of a StatefulSet per group member, each with a volume of its
// own for its offset file. It reads its Config from the environment the
// manifest sets, and runs until SIGTERM.
//
// What the manifest wires, and why (TestManifest checks each against
// this program):
//
//   - A StatefulSet, not a Deployment, with a volumeClaimTemplate mounted
//     at TIDEMARK_OFFSET_DIR, where the offset file lives: the file is the
//     source of truth of what was handled, so pod payments-1 must find
//     the file it left after a restart or a move to another node. A
//     Deployment's pods have no stable volume of their own.
//   - POD_NAME from the downward API (metadata.name) becomes
//     Config.InstanceID: a static member (KIP-345) whose restart within
//     SessionTimeout gets its partitions back without a rebalance of the
//     others. A StatefulSet's pod names are stable (payments-0, -1, ...)
//     and unique, as InstanceID must be; one pod, one id, one volume.
//   - The probes: liveness on /healthz and readiness on /readyz, on the
//     port Config.StatusAddr listens on, on every interface (a probe comes
//     from the kubelet, not from loopback). Liveness restarts a consumer
//     whose Run is gone or stuck, or whose disk takes no writes; its
//     failureThreshold gives the offset file's writer a minute of retries.
//     Readiness holds a rolling update until the new pod joined the group
//     and reconciled its partitions. A commit outage fails neither: a
//     restart would not help.
//   - terminationGracePeriodSeconds above shutdownBound: on SIGTERM Run
//     drains (at most DrainTimeout), flushes and makes the final commit
//     (retried for at most DrainTimeout, each request at most Timeout), so
//     that the kubelet's SIGKILL never cuts the final commit short. A
//     SIGKILL would lose nothing (the next run resumes from the file) but
//     would leave Kafka's committed offset behind.
//   - podManagementPolicy Parallel: the members start together and the
//     group settles in one rebalance, rather than one per pod.
//
// Caveats: a pod's volume follows its name, so scaling down leaves the
// removed pods' files behind (harmless: a partition's next owner resumes
// from Kafka's committed offset, or its own file); scaling back up finds
// them again, a little behind, and reconciliation takes the newer
// position. Two pods must never share a volume: the file is locked by
// one process at a time.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/zap"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
)

// The environment statefulset.yaml sets.
const (
	EnvPodName    = "POD_NAME"             // metadata.name, through the downward API
	EnvBrokers    = "TIDEMARK_BROKERS"     // host:port[,host:port...]
	EnvGroup      = "TIDEMARK_GROUP"       // the consumer group
	EnvTopics     = "TIDEMARK_TOPICS"      // topic[,topic...]
	EnvOffsetDir  = "TIDEMARK_OFFSET_DIR"  // the volume's mount path
	EnvStatusPort = "TIDEMARK_STATUS_PORT" // the probes' port
)

// OffsetFileName is the offset file's name in TIDEMARK_OFFSET_DIR.
const OffsetFileName = "offsets.db"

// The shutdown's timeouts, set explicitly so that the manifest's
// terminationGracePeriodSeconds can be checked against them.
const (
	drainTimeout   = 5 * time.Second
	requestTimeout = 10 * time.Second
)

// configFromEnv builds the service's Config from getenv (os.Getenv in
// main). Every variable is required.
func configFromEnv(getenv func(string) string, h handler.Handler, log *zap.Logger) (framework.Config, error) {
	var errs []error
	get := func(name string) string {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			errs = append(errs, fmt.Errorf("environment variable %s is not set", name))
		}
		return v
	}
	list := func(name string) []string {
		var out []string
		for _, s := range strings.Split(get(name), ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
		return out
	}
	cfg := framework.Config{
		Brokers:      list(EnvBrokers),
		GroupID:      get(EnvGroup),
		Topics:       list(EnvTopics),
		InstanceID:   get(EnvPodName),
		OffsetFile:   filepath.Join(get(EnvOffsetDir), OffsetFileName),
		Handler:      h,
		Logger:       log,
		DrainTimeout: drainTimeout,
		Timeout:      requestTimeout,
	}
	port := get(EnvStatusPort)
	if n, err := strconv.Atoi(port); port != "" && (err != nil || n < 1 || n > 65535) {
		errs = append(errs, fmt.Errorf("%s=%q is not a port number", EnvStatusPort, port))
	}
	// Every interface: the kubelet probes the pod's IP.
	cfg.StatusAddr = net.JoinHostPort("0.0.0.0", port)
	return cfg, errors.Join(errs...)
}

// shutdownBound is the longest Run takes to return after SIGTERM with
// cfg: the drain (DrainTimeout), then the final commit, retried for at
// most DrainTimeout, its last request taking at most Timeout. The
// manifest's terminationGracePeriodSeconds must be above it.
func shutdownBound(cfg framework.Config) time.Duration {
	return 2*cfg.DrainTimeout + cfg.Timeout
}

// handle is the service's work: here it logs each message. A real
// service does its work here, and returns an error to have it retried.
func handle(log *zap.Logger) handler.Handler {
	return handler.HandlerFunc(func(_ context.Context, m kafka.Message) error {
		log.Debug("handled", zap.String("topic", m.Topic), zap.Int("partition", m.Partition),
			zap.Int64("offset", m.Offset), zap.ByteString("key", m.Key))
		return nil
	})
}

func main() {
	log, err := zap.NewProduction()
	if err != nil {
		fmt.Fprintln(os.Stderr, "kubernetes:", err)
		os.Exit(1)
	}
	if err := run(log); err != nil {
		log.Error("stopped", zap.Error(err))
		_ = log.Sync()
		os.Exit(1)
	}
	_ = log.Sync()
}

func run(log *zap.Logger) error {
	cfg, err := configFromEnv(os.Getenv, handle(log), log)
	if err != nil {
		return err
	}
	c, err := framework.New(cfg)
	if err != nil {
		return err
	}
	// The kubelet sends SIGTERM, then SIGKILL after the grace period.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return c.Run(ctx)
}
