package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/framework"
)

// The wide section's child (wide.go): one consumer on a topic of many
// partitions, as a new user would write it: every value printed through a
// buffered writer. Once the topic is handled, with Spec.IdleWindow, the
// child counts the fetch requests the idle consumer sends, and its CPU.

// wideSettle is how long the child waits after the last message before the
// idle window: the fetches and commits of the backlog's end are left out.
const wideSettle = time.Second

// wideConsumers run the section's consumers; each stores, once it has a
// client, the function that counts its fetch requests.
var wideConsumers = map[string]func(ctx context.Context, sp *childSpec, s *sink, fetches *atomic.Pointer[func() uint64]) error{
	consTidemark: runWideTidemark,
	consFranz:    runWideFranz,
}

// valuePrinter prints each value on a line of its own through a
// bufio.Writer (its default 4 KiB buffer) to os.DevNull, under a mutex:
// tidemark calls the Handler on one goroutine per partition.
type valuePrinter struct {
	mu  sync.Mutex
	f   *os.File
	w   *bufio.Writer
	n   int64
	err error
}

func newValuePrinter() (*valuePrinter, error) {
	f, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	return &valuePrinter{f: f, w: bufio.NewWriter(f)}, nil
}

func (p *valuePrinter) print(v []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.w.Write(v); err != nil && p.err == nil {
		p.err = err
	}
	if err := p.w.WriteByte('\n'); err != nil && p.err == nil {
		p.err = err
	}
	p.n += int64(len(v)) + 1
}

// close flushes and closes, and returns the bytes printed.
func (p *valuePrinter) close() (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	err := p.err
	if ferr := p.w.Flush(); ferr != nil && err == nil {
		err = ferr
	}
	if cerr := p.f.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return p.n, err
}

// runWide runs the named consumer until it handled Want messages, then,
// with IdleWindow, measures it idle, and stops it.
func runWide(ctx context.Context, sp *childSpec, out *lineWriter) (childResult, error) {
	run, ok := wideConsumers[sp.Consumer]
	if !ok {
		return childResult{}, fmt.Errorf("the wide section has no consumer %q", sp.Consumer)
	}
	pr, err := newValuePrinter()
	if err != nil {
		return childResult{}, err
	}
	s := newSink(sp, out)
	s.print = pr.print
	var fetches atomic.Pointer[func() uint64]
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- run(cctx, sp, s, &fetches) }()

	if err := s.wait(ctx, ran); err != nil {
		stop()
		if !errors.Is(err, errConsumerReturned) {
			<-ran
		}
		_, _ = pr.close()
		return childResult{}, err
	}
	var idle struct {
		requests uint64
		window   time.Duration
		cpu      time.Duration
	}
	if f := fetches.Load(); sp.IdleWindow > 0 && f != nil {
		if err := sleepCtx(ctx, wideSettle); err != nil {
			stop()
			<-ran
			return childResult{}, err
		}
		r0, c0, t0 := (*f)(), selfCPU(), time.Now()
		if err := sleepCtx(ctx, sp.IdleWindow); err != nil {
			stop()
			<-ran
			return childResult{}, err
		}
		r1, c1, t1 := (*f)(), selfCPU(), time.Now()
		idle.requests, idle.cpu, idle.window = r1-r0, c1-c0, t1.Sub(t0)
	}
	stopped := time.Now()
	stop()
	if err := <-ran; err != nil {
		return childResult{}, fmt.Errorf("stopping the consumer: %w", err)
	}
	took := time.Since(stopped)
	printed, perr := pr.close()
	if perr != nil {
		return childResult{}, fmt.Errorf("printing the values: %w", perr)
	}
	res, err := s.result()
	res.Stop = took
	res.LastAt, res.CPUAtEnd, res.Printed = s.t1, s.cpu1, printed
	res.IdleRequests, res.IdleWindow, res.IdleCPU = idle.requests, idle.window, idle.cpu
	return res, err
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runWideTidemark is tidemark at its defaults (the throughput runs'
// Config); Stats().FetchRequests counts its fetches.
func runWideTidemark(ctx context.Context, sp *childSpec, s *sink, fetches *atomic.Pointer[func() uint64]) error {
	cfg, closeLog, err := tidemarkConfig(sp, s, false)
	if err != nil {
		return err
	}
	defer closeLog()
	c, err := framework.New(cfg)
	if err != nil {
		return err
	}
	count := func() uint64 { return c.Stats().FetchRequests }
	fetches.Store(&count)
	wctx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if awaitGeneration(wctx, c) {
			s.assigned()
		}
	}()
	err = c.Run(ctx)
	stopWatch()
	<-watched
	return err
}

// fetchCounter counts the Fetch requests a franz-go client writes.
type fetchCounter struct{ n atomic.Uint64 }

func (f *fetchCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.Fetch) && err == nil {
		f.n.Add(1)
	}
}

var _ kgo.HookBrokerWrite = (*fetchCounter)(nil)

// runWideFranz is the throughput runs' franz-go group consumer
// (AutoCommitMarks, each partition's last record of a poll marked), with a
// hook that counts its fetch requests.
func runWideFranz(ctx context.Context, sp *childSpec, s *sink, fetches *atomic.Pointer[func() uint64]) error {
	fc := &fetchCounter{}
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(sp.Brokers...),
		kgo.ClientID("bench-franz-go"),
		kgo.ConsumerGroup(sp.Group),
		kgo.ConsumeTopics(sp.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.AutoCommitMarks(),
		kgo.OnPartitionsAssigned(func(context.Context, *kgo.Client, map[string][]int32) { s.assigned() }),
		kgo.WithHooks(fc),
	)
	if err != nil {
		return fmt.Errorf("kgo.NewClient: %w", err)
	}
	defer cl.Close()
	count := fc.n.Load
	fetches.Store(&count)
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err := fs.Err(); err != nil {
			return fmt.Errorf("PollFetches: %w", err)
		}
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			for _, r := range p.Records {
				s.see(int(r.Partition), r.Offset, r.Value)
			}
			if n := len(p.Records); n > 0 {
				cl.MarkCommitRecords(p.Records[n-1])
			}
		})
	}
}
