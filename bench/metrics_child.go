package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/metrics"
)

// The metrics section's children (metrics.go): the scrape child runs
// tidemark on many partitions and measures what scraping metrics.Handler
// costs; the throughput children are the usual ones, with Spec.Metrics
// registering a Collector scraped every second (runTidemark).

// prometheusAccept is the Accept header of a Prometheus 3 scrape; it also
// sends Accept-Encoding: gzip.
const prometheusAccept = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5," +
	"text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"

// scrapeOnce serves one scrape of h in-process, as Prometheus asks for
// it (with gzip, or without), and returns the response.
func scrapeOnce(h http.Handler, gzip bool) (*httptest.ResponseRecorder, error) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/metrics", nil)
	req.Header.Set("Accept", prometheusAccept)
	if gzip {
		req.Header.Set("Accept-Encoding", "gzip")
	}
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %d %s", rec.Code, strings.TrimSpace(rec.Body.String()))
	}
	return rec, nil
}

// scrapeEverySecond scrapes h as soon as first is closed (the window
// starts: a no-op run may last less than a second), then once a second,
// until ctx ends; it returns the scrapes served, or the first error.
func scrapeEverySecond(ctx context.Context, h http.Handler, first <-chan struct{}) (int, error) {
	select {
	case <-ctx.Done():
		return 0, nil
	case <-first:
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	n := 0
	for {
		if _, err := scrapeOnce(h, true); err != nil {
			return n, err
		}
		n++
		select {
		case <-ctx.Done():
			return n, nil
		case <-t.C:
		}
	}
}

// runScrape is the scrape child: tidemark on sp.Partitions partitions
// consumes the backlog (sp.Want messages), then, with every partition
// idle, the child measures its CPU over sp.IdleWindow without scrapes,
// then over sp.Scrapes scrapes of metrics.Handler served back to back;
// the scrapes' own cost is their CPU minus the idle rate over their wall
// time. A CPU profile (-profile) covers the scrapes.
func runScrape(ctx context.Context, sp *childSpec, out *lineWriter) (childResult, error) {
	profile := sp.CPUProfile // of the scrapes, not of the sink's window
	sp.CPUProfile = ""
	s := newSink(sp, out)
	cfg, closeLog, err := tidemarkConfig(sp, s, false)
	if err != nil {
		return childResult{}, err
	}
	defer closeLog()
	c, err := framework.New(cfg)
	if err != nil {
		return childResult{}, err
	}
	h := metrics.Handler(c)
	cctx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- c.Run(cctx) }()

	err = s.wait(ctx, ran)
	var idle idleFigures
	if err == nil {
		idle, err = measureIdle(ctx, c, sp.IdleWindow, ran)
	}
	var sc scrapeFigures
	if err == nil {
		sc, err = measureScrapes(c, h, sp.Scrapes, profile)
	}
	stop()
	if err != nil {
		if !errors.Is(err, errConsumerReturned) {
			<-ran
		}
		return childResult{}, err
	}
	if err := <-ran; err != nil {
		return childResult{}, fmt.Errorf("Run: %w", err)
	}
	res, err := s.result()
	res.IdleRequests, res.IdleWindow, res.IdleCPU = idle.requests, idle.window, idle.cpu
	res.Scrapes, res.ScrapeCPU, res.ScrapeWall = sc.n, sc.cpu, sc.wall
	res.ScrapeBytes, res.ScrapeGzipBytes, res.Series = sc.bytes, sc.gzipBytes, sc.series
	return res, err
}

type scrapeFigures struct {
	n                int
	cpu, wall        time.Duration
	bytes, gzipBytes int64
	series           int
}

// measureScrapes serves n scrapes of h back to back (gzip, as Prometheus
// asks) and measures their CPU and wall time; one more scrape, outside the
// measure, without gzip, gives the exposition's size and series.
func measureScrapes(c *framework.Consumer, h http.Handler, n int, profile string) (scrapeFigures, error) {
	var f scrapeFigures
	plain, err := scrapeOnce(h, false)
	if err != nil {
		return f, err
	}
	f.bytes = int64(plain.Body.Len())
	handled := 0
	sc := bufio.NewScanner(plain.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if line := sc.Text(); line != "" && !strings.HasPrefix(line, "#") {
			f.series++
			if strings.HasPrefix(line, "tidemark_handled_messages_total{") {
				handled++
			}
		}
	}
	if want := len(c.Stats().Partitions); handled != want {
		return f, fmt.Errorf("the exposition shows %d partitions, Stats %d", handled, want)
	}
	if profile != "" {
		prof, err := startProfile(profile)
		if err != nil {
			return f, err
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = prof.Close()
		}()
	}
	cpu0, t0 := selfCPU(), time.Now()
	for i := 0; i < n; i++ {
		rec, err := scrapeOnce(h, true)
		if err != nil {
			return f, err
		}
		f.gzipBytes = int64(rec.Body.Len())
	}
	f.cpu, f.wall, f.n = selfCPU()-cpu0, time.Since(t0), n
	return f, nil
}
