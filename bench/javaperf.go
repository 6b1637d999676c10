package main

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// kafkaPerf runs Apache Kafka's own consumer benchmark,
// org.apache.kafka.tools.ConsumerPerformance (kafka-consumer-perf-test),
// through scripts/kafka-local, on the same topic with a fresh group. Its
// msgs/s is fetch.nMsg.sec: from the end of the group join to the last
// record. Its CPU and RSS are the whole JVM's (startup and JIT included), and
// it reports neither allocations nor latency.
func (b *bench) kafkaPerf(ctx context.Context, topic string, want int64) (childResult, error) {
	cctx, cancel := context.WithTimeout(ctx, b.o.timeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, b.o.kafkaLocal, "tool", "org.apache.kafka.tools.ConsumerPerformance",
		"--bootstrap-server", strings.Join(b.broker.addrs, ","),
		"--topic", topic,
		"--num-records", strconv.FormatInt(want, 10),
		"--group", b.group(consKafkaPerf),
		"--timeout", "30000",
	)
	var stdout bytes.Buffer
	var stderr tailBuffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return childResult{}, err
	}
	// kafka-local execs java in the same process; its VmHWM is read until
	// it exits (wait4's ru_maxrss would include this process's RSS).
	var hwm atomic.Int64
	polled := make(chan struct{})
	stopPoll := make(chan struct{})
	go func() {
		defer close(polled)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		status := fmt.Sprintf("/proc/%d/status", cmd.Process.Pid)
		for {
			if v := procHWM(status); v > hwm.Load() {
				hwm.Store(v)
			}
			select {
			case <-stopPoll:
				return
			case <-t.C:
			}
		}
	}()
	err := cmd.Wait()
	close(stopPoll)
	<-polled
	if err != nil {
		return childResult{}, fmt.Errorf("%s: %w; stderr ends with:\n%s", cmd, err, stderr.String())
	}
	res, err := parseConsumerPerf(stdout.String())
	if err != nil {
		return res, fmt.Errorf("%w; output:\n%s", err, stdout.String())
	}
	res.MaxRSS = hwm.Load()
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		res.ProcCPU = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		res.CPU = res.ProcCPU // the whole JVM: no way to take the window alone
	}
	return res, nil
}

// parseConsumerPerf reads ConsumerPerformance's CSV-like output: a header
// line naming the columns, then one line of values.
func parseConsumerPerf(out string) (childResult, error) {
	var header []string
	for _, line := range strings.Split(out, "\n") {
		fields := strings.Split(line, ",")
		for i := range fields {
			fields[i] = strings.TrimSpace(fields[i])
		}
		if len(fields) > 0 && fields[0] == "start.time" {
			header = fields
			continue
		}
		if header == nil || len(fields) != len(header) {
			continue
		}
		col := map[string]string{}
		for i, h := range header {
			col[h] = fields[i]
		}
		n, err1 := strconv.ParseInt(col["data.consumed.in.nMsg"], 10, 64)
		fetchMs, err2 := strconv.ParseFloat(col["fetch.time.ms"], 64)
		if err1 != nil || err2 != nil {
			return childResult{}, fmt.Errorf("ConsumerPerformance output: nMsg %q, fetch.time.ms %q", col["data.consumed.in.nMsg"], col["fetch.time.ms"])
		}
		return childResult{Messages: n, Window: time.Duration(fetchMs * float64(time.Millisecond))}, nil
	}
	return childResult{}, fmt.Errorf("no ConsumerPerformance result line")
}
