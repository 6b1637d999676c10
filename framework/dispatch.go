package framework

import (
	"context"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// Concurrency inside a partition. The partition's goroutine (partition.go)
// hands each decoded message, in offset order, to its dispatcher, which
// queues it in a lane and runs jobs cut from the lanes. A job is one
// BatchHandler call of up to BatchSize messages, or Handler calls: one
// message from the shared lane, or every message waiting in an ordered
// lane, called one after the other.
//
//   - OrderPartition: with a Handler, each message is called as it comes, on
//     the partition's goroutine (no lane, no goroutine, no channel: the
//     fast path); with a BatchHandler, one lane, one job at a time, on that
//     goroutine too.
//   - OrderKey: a lane per key; a lane runs one job at a time, different
//     lanes run at once, up to MaxInFlight jobs, on the dispatcher's
//     workers: goroutines started as jobs need them and kept for the run,
//     taking jobs from a run queue. Messages without a key share a lane
//     whose jobs run at once.
//   - OrderNone: that shared lane for every message.
//
// After an unclean end (careful mode, failure.go) every ordering runs one
// message at a time on the partition's goroutine, so that the crash-loop
// breaker names the exact message.
//
// Completions come back through an inbox and move the tracker's watermark
// (tracker.go). The dispatcher reads ahead of the jobs while what it reads
// cannot start anyway (its key is in a call): messages waiting in a lane are
// copied out of the fetched response and counted in the fetch budget, so
// that the response can be released. It stops reading when MaxWindow
// messages are pending at or above the watermark, when a full job is
// ready and every call slot is taken, or while its workers have not taken
// the jobs it started (ease): when the CPUs, not the calls, are the limit,
// reading ahead would only copy messages (quick calls then cost 1.5x
// OrderPartition's CPU per message instead of 3x).
//
// An ordered lane and its running job take turns with two arrays (spare),
// so a key's messages are queued without an allocation each.

// lane is a run of messages that are handled in order. Owned by the
// dispatcher.
type lane struct {
	key   string
	keyed bool // in dispatcher.lanes
	// ordered lanes run one job at a time (busy while it runs); the shared
	// lane of unordered messages never is busy.
	ordered bool
	busy    bool
	// blocked: a job of this ordered lane ended with messages not done
	// (the partition is stopping): the messages after them must not run.
	blocked bool
	msgs    []kafka.Message // waiting, in offset order
	// spare: with reuse, the array of the lane's last job, cleared, for
	// the messages after the next job's: an ordered lane runs one job at a
	// time, so two arrays (of up to maxSpare) take turns.
	spare []kafka.Message
	// attached: msgs[len(msgs)-attached:] still slice into the response
	// being decoded; the others were copied out, and their bytes are
	// counted in the fetch budget (detached).
	attached int
	detached int64
	// last is the size of the job that last took the whole array: the
	// next array is made that large at once rather than grown to it.
	last  int
	since int64 // UnixNano when the oldest waiting message arrived
	ready bool  // in dispatcher.ready
}

// startable reports whether a job may be cut from l now.
func (l *lane) startable() bool { return len(l.msgs) > 0 && !l.busy && !l.blocked }

// job is one Handler (one message) or BatchHandler call's messages, and
// the lane they came from.
type job struct {
	l    *lane
	msgs []kafka.Message
	ctx  context.Context // the partition run's, or in the drain the Handler's
	// whole: msgs is its lane's whole array, from its first element: the
	// lane takes it back once the job ended (reuse).
	whole bool
}

// result is what a worker reports: messages done (in order), and
// at the end, final, with ok false if the job stopped before its last
// message was done.
type result struct {
	j     *job
	done  []kafka.Message
	final bool
	ok    bool
}

// dispatcher runs one partition's Handler calls for one run of it. It is
// owned by the partition's goroutine; its workers only take jobs from runq
// and push results.
//
// In direct mode (OrderPartition with a Handler) each message is called as
// it comes (handleInline) and the dispatcher has no queues: a partition of
// a wide topic costs the few fields below, not the lanes, jobs and
// workers' state of queues.
type dispatcher struct {
	p  *partition
	tr *tracker
	// ctx is the partition run's; jobs started once it ended (the drain) run
	// under hctx, the Handler's context, which ends DrainTimeout later.
	ctx, hctx context.Context

	maxUndurable int64
	mark         *offsetfile.Marker // the partition's progress in the offset file
	changed      func()             // tells the offset file the tracker moved
	now          int64              // UnixNano, refreshed per batch and per wake

	*queues // nil in direct mode (see direct)
}

// direct reports direct mode: OrderPartition with a Handler, every message
// handled as it comes (handleInline), with no queues.
func (d *dispatcher) direct() bool { return d.queues == nil }

// queues is the dispatcher's lanes and jobs, for every mode but direct.
type queues struct {
	maxInFlight int
	batchSize   int
	maxWindow   int
	linger      int64 // nanoseconds

	lanes    map[string]*lane // OrderKey: keyed lanes with messages waiting or in a call
	seq      *lane            // OrderPartition's lane
	shared   *lane            // unordered messages (OrderKey's without a key); nil with OrderPartition
	ready    []*lane          // lanes with a job to start, oldest first
	free     []*lane          // keyed lanes to reuse
	queued   int              // messages in startable lanes
	waiting  int              // messages in lanes
	inflight int              // jobs running

	// results and runq are the workers' (work), started as calls need
	// them, up to MaxInFlight; wg awaits them. Both nil with MaxInFlight
	// 1: every job runs inline.
	results  *inbox[result]
	runq     *runq
	workers  int
	wg       sync.WaitGroup
	spare    []result // results' other buffer (inbox.take)
	freeJobs []*job   // finished jobs, for reuse
	// attachedLanes are the lanes with messages that still slice into the
	// response being decoded (flush copies them out).
	attachedLanes []*lane
	offsets       []int64 // completed's buffer
	maxDone       int64   // the highest offset done in this run
	// reuse: jobs run inline and get their message by value (a Handler),
	// or their slice only until the call returns (a TxHandler's runs), so
	// a lane's array and the job may be reused once the job returned.
	reuse     bool
	inlineJob job
}

func newDispatcher(p *partition, tr *tracker, ctx, hctx context.Context, changed func()) *dispatcher {
	cfg := p.env.cfg
	d := &dispatcher{
		p: p, tr: tr, ctx: ctx, hctx: hctx,
		maxUndurable: int64(cfg.MaxUndurable),
		changed:      changed,
		now:          time.Now().UnixNano(),
	}
	if cfg.Ordering == OrderPartition && p.env.batch == nil {
		return d // direct
	}
	q := &queues{
		maxInFlight: cfg.MaxInFlight,
		batchSize:   cfg.BatchSize,
		maxWindow:   cfg.MaxWindow,
		linger:      int64(cfg.BatchLinger),
		// A TxHandler's runs (batch too) get their slice only until the
		// call returns (handler.TxHandler), unlike a BatchHandler.
		reuse: p.env.batch == nil || cfg.TxHandler != nil,
	}
	d.queues = q
	switch cfg.Ordering {
	case OrderPartition:
		q.seq = &lane{ordered: true}
	case OrderKey:
		q.lanes = map[string]*lane{}
	}
	if q.seq == nil {
		q.shared = &lane{} // OrderNone's messages, OrderKey's without a key
	}
	if cfg.MaxInFlight > 1 {
		// Workers only run jobs when calls may overlap: with one call at
		// a time every job runs inline, and a partition of a wide topic
		// costs neither the queue nor the results' inbox.
		q.results = newInbox[result]()
		q.runq = &runq{wake: make(chan struct{}, cfg.MaxInFlight), caughtUp: make(chan struct{}, 1)}
	}
	return d
}

// inline reports whether jobs run on the partition's goroutine: one call
// at a time (OrderPartition, or careful mode after an unclean end).
func (d *dispatcher) inline() bool { return d.maxInFlight == 1 || d.p.iv.br.careful }

// jobSize is the most messages in l's next job: one in careful mode;
// BatchSize for a BatchHandler; with a Handler, one from the shared lane
// (its messages may run at once), and everything waiting from an ordered
// lane, whose messages run one after the other anyway (one hand-off to a
// worker for the lot).
func (d *dispatcher) jobSize(l *lane) int {
	switch {
	case d.p.iv.br.careful:
		return 1
	case d.p.env.batch != nil || !l.ordered:
		return d.batchSize
	}
	return d.maxWindow
}

// maxSpare is the capacity of the largest array a lane keeps for reuse, so
// that a burst of one key's messages does not stay allocated.
const maxSpare = 16

// maxIdleLanes is how many keyed lanes a dispatcher keeps before it drops
// the idle ones as they empty.
const maxIdleLanes = 4096

// laneOf returns m's lane.
func (d *dispatcher) laneOf(m *kafka.Message) *lane {
	switch {
	case d.seq != nil:
		return d.seq
	case d.lanes == nil || m.Key == nil:
		return d.shared
	}
	if l := d.lanes[string(m.Key)]; l != nil {
		return l
	}
	var l *lane
	if n := len(d.free); n > 0 {
		l, d.free = d.free[n-1], d.free[:n-1]
	} else {
		l = &lane{ordered: true, keyed: true}
	}
	l.key = string(m.Key)
	d.lanes[l.key] = l
	return l
}

// add takes the next message in offset order. It reports false when the
// partition's loop must end (the partition is stopping, or a run was
// abandoned).
func (d *dispatcher) add(m *kafka.Message) bool {
	if d.ctx.Err() != nil {
		return false
	}
	if d.tr.skip(m.Offset) {
		return true
	}
	if d.direct() {
		return d.handleInline(m)
	}
	if !d.boundReach() {
		return false
	}
	for d.tr.window() >= d.maxWindow || (d.inflight >= d.maxInFlight && d.queued >= d.batchSize) {
		if d.inline() {
			// Only a lingering batch can fill an inline window.
			if !d.schedule(anySize) {
				return false
			}
			continue
		}
		full := d.tr.window() >= d.maxWindow
		if full {
			d.p.st.windowFull.Store(true)
		}
		ok := d.wait(nil)
		if full {
			d.p.st.windowFull.Store(false)
		}
		if !ok {
			return false
		}
	}
	d.tr.begin(m.Offset, d.now, m.Time.UnixNano())
	l := d.laneOf(m)
	if len(l.msgs) == 0 {
		l.since = d.now
		if cap(l.msgs) == 0 && l.last > 1 {
			l.msgs = make([]kafka.Message, 0, l.last)
		}
	}
	l.msgs = append(l.msgs, *m)
	if l.attached++; l.attached == 1 {
		d.attachedLanes = append(d.attachedLanes, l)
	}
	d.waiting++
	d.p.st.waiting.Add(1)
	if l.startable() {
		d.queued++
		d.enqueue(l)
	}
	if len(l.msgs) >= d.jobSize(l) {
		return d.schedule(fullOnly)
	}
	return true
}

// handleInline is the fast path of OrderPartition with a Handler: m is
// handled here and now, without a lane. It reports false when the loop
// must end.
func (d *dispatcher) handleInline(m *kafka.Message) bool {
	// The tracker shows the call in Stats (InFlight, OldestIncomplete).
	d.tr.beginOne(m.Offset, d.now, m.Time.UnixNano())
	if !d.p.iv.handleOne(d.ctx, d.hctx, m) || d.p.abandoned.Load() {
		return false
	}
	d.tr.completeOne(m.Offset)
	d.p.st.handled.Add(1)
	d.changed()
	return d.bound(m.Offset + 1)
}

// bound waits, when the partition has handled MaxUndurable messages beyond
// its durable watermark, until the offset file has caught up with all but
// MaxUndurable-1 of processed (one after every message with MaxUndurable 1).
// It reports false if the partition stopped first.
func (d *dispatcher) bound(processed int64) bool {
	if processed-d.mark.Durable() < d.maxUndurable {
		return true
	}
	st := d.p.st
	st.durableWait.Store(true)
	err := d.mark.WaitDurable(d.ctx, processed-d.maxUndurable+1)
	st.durableWait.Store(false)
	return err == nil
}

// boundReach is bound for OrderKey and OrderNone, where offsets complete
// out of order above the watermark: before the next message is dispatched,
// the messages the offset file does not prove done (in a call, waiting for
// their key, or done since the last flush) must be fewer than
// MaxUndurable. What a SIGKILL makes the next run handle again is among
// them. The owner reads the tracker without its lock.
//
// While it waits it collects the calls' results and starts what they make
// startable: the file cannot catch up on completions not yet collected.
func (d *dispatcher) boundReach() bool {
	if d.tr.reach()-d.mark.DurableDone() < d.maxUndurable {
		return true
	}
	st := d.p.st
	st.durableWait.Store(true)
	defer st.durableWait.Store(false)
	for {
		flushed := d.mark.Flushed()
		if d.tr.reach()-d.mark.DurableDone() < d.maxUndurable {
			return true
		}
		if !d.wait(flushed) {
			return false
		}
	}
}

// ease waits, before the next batch is decoded, while more than easeJobs
// jobs wait for a worker to take them: the workers are behind (the CPUs
// are busy), and what the dispatcher would read now would only wait in
// lanes behind their keys' jobs, copied out of the response. Reading
// resumes once the workers took all but easeJobs of them. Workers that
// wait in calls (I/O) take their jobs at once, so reading ahead for them
// goes on. It reports false when the loop must end.
func (d *dispatcher) ease() bool {
	if d.direct() || d.inline() {
		return true
	}
	for d.runq.behind() {
		if !d.wait(d.runq.caughtUp) {
			return false
		}
	}
	return true
}

// easeJobs: see dispatcher.ease.
const easeJobs = 4

// enqueue puts a startable lane on the ready list.
func (d *dispatcher) enqueue(l *lane) {
	if !l.ready {
		l.ready = true
		d.ready = append(d.ready, l)
	}
}

// Scheduling modes: which jobs smaller than a full batch may start.
const (
	fullOnly = iota // only full batches: more messages may still come
	lingered        // partial batches whose BatchLinger has passed
	anySize         // every startable lane
)

// schedule starts jobs from the ready lanes while call slots are free,
// cutting partial batches as mode allows. Inline jobs run to completion
// here. It reports false when the loop must end.
func (d *dispatcher) schedule(mode int) bool {
	n := 0 // d.ready[:n] stay listed
	for i := 0; i < len(d.ready); i++ {
		l := d.ready[i]
		if !l.startable() {
			l.ready = false
			continue
		}
		size := d.jobSize(l)
		small := len(l.msgs) < size
		wait := small && (mode == fullOnly || (mode == lingered && d.linger > 0 && d.now-l.since < d.linger))
		// The drain runs a waiting message only below an offset done
		// above it, which the next owner would handle again otherwise;
		// what waits above every done offset is left to the next owner.
		above := d.ctx.Err() != nil && l.msgs[0].Offset > d.maxDone
		if d.inflight >= d.maxInFlight || wait || above || d.p.abandoned.Load() {
			d.ready[n] = l
			n++
			continue
		}
		j := d.cut(l, size)
		l.ready = false
		if l.startable() {
			d.enqueue(l) // the shared lane may start another job at once
		}
		if !d.start(j) {
			n += copy(d.ready[n:], d.ready[i+1:])
			clear(d.ready[n:])
			d.ready = d.ready[:n]
			return false
		}
	}
	clear(d.ready[n:])
	d.ready = d.ready[:n]
	return true
}

// cut takes the first n messages (at most) of l as a job.
func (d *dispatcher) cut(l *lane, n int) *job {
	n = min(n, len(l.msgs))
	msgs := l.msgs[:n:n]
	// Messages copied out of their response give their bytes back: in a
	// call they count, like the message in a call of OrderPartition, as
	// the call's.
	if copied := len(l.msgs) - l.attached; copied > 0 {
		var n2 int64
		for i := range msgs[:min(n, copied)] {
			n2 += messageSize(&msgs[i])
		}
		l.detached -= n2
		d.p.env.fetcher.release(d.p, n2)
	}
	l.attached = min(l.attached, len(l.msgs)-n)
	inline := d.inline()
	whole := false
	switch {
	case len(l.msgs) == n && d.reuse && inline:
		l.msgs = l.msgs[:0] // the job runs before the next message is added
	case len(l.msgs) == n && d.reuse && l.ordered:
		// The job takes the array; the lane fills its spare meanwhile.
		msgs, whole = l.msgs[:n], true
		l.msgs, l.spare = l.spare, nil
	case len(l.msgs) == n:
		l.msgs, l.last = nil, n
	default:
		l.msgs = l.msgs[n:]
		l.since = d.now
	}
	d.queued -= n
	d.waiting -= n
	if l.ordered {
		l.busy = true
		d.queued -= len(l.msgs) // no longer startable until the job ends
	}
	if inline {
		d.inlineJob = job{l: l, msgs: msgs}
		return &d.inlineJob
	}
	if n := len(d.freeJobs); n > 0 {
		j := d.freeJobs[n-1]
		d.freeJobs = d.freeJobs[:n-1]
		j.l, j.msgs, j.whole = l, msgs, whole
		return j
	}
	return &job{l: l, msgs: msgs, whole: whole}
}

// start runs j: inline, to completion, or on a worker. It
// reports false when an inline job did not finish (the partition is stopping).
func (d *dispatcher) start(j *job) bool {
	d.inflight++
	ctx := d.ctx
	if ctx.Err() != nil {
		ctx = d.hctx // the drain: what the window holds runs until DrainTimeout
	}
	if d.inline() {
		ok := d.p.iv.handleJob(ctx, d.hctx, j.msgs, 0, func(from, to int) { d.completed(j.msgs[from:to]) })
		if d.reuse {
			clear(j.msgs) // the lane reuses the array: drop the fetched bytes it points at
		}
		d.finish(j, ok)
		return ok && !d.p.abandoned.Load()
	}
	j.ctx = ctx
	if d.workers < d.inflight { // every worker is busy: one more
		d.workers++
		d.wg.Add(1)
		go d.work()
	}
	d.runq.push(j)
	return true
}

// work is a worker goroutine of the dispatcher: it runs jobs until jobs is
// closed (dispatcher.close). Workers live as long as the partition's run,
// so their stacks, grown by the Handler, are grown once.
func (d *dispatcher) work() {
	defer d.wg.Done()
	for {
		j := d.runq.pop()
		if j == nil {
			return
		}
		// Each message done is reported as its call returns: the next call
		// of the job may take any time, and a completion held back until it
		// returns would keep the watermark, the offset file and the commit
		// behind a finished call (a SIGKILL then has it handled again). The
		// last message goes with the job's end: one result for a quick job.
		tail := len(j.msgs)
		ok := d.p.iv.handleJob(j.ctx, d.hctx, j.msgs, 0, func(f, t int) {
			if t < len(j.msgs) {
				d.results.push(result{j: j, done: j.msgs[f:t]})
				return
			}
			// The job's last run: reported with its end, below.
			tail = f
		})
		var done []kafka.Message
		if tail < len(j.msgs) {
			done = j.msgs[tail:]
		}
		d.results.push(result{j: j, done: done, final: true, ok: ok})
	}
}

// completed marks messages done.
func (d *dispatcher) completed(msgs []kafka.Message) {
	if d.p.abandoned.Load() {
		return // revoke stopped waiting: the next owner handles it again
	}
	d.offsets = d.offsets[:0]
	for i := range msgs {
		d.offsets = append(d.offsets, msgs[i].Offset)
		d.maxDone = max(d.maxDone, msgs[i].Offset)
	}
	d.tr.complete(d.offsets...)
	d.p.st.handled.Add(uint64(len(msgs)))
	d.changed()
}

// finish ends job j: its lane may start the next, unless the job stopped
// before its last message (ok false): an ordered lane then stays blocked.
func (d *dispatcher) finish(j *job, ok bool) {
	d.inflight--
	l := j.l
	if j.whole && cap(j.msgs) <= maxSpare {
		clear(j.msgs) // drop the fetched bytes it points at
		switch {
		case cap(l.msgs) == 0:
			l.msgs = j.msgs[:0]
		case l.spare == nil:
			l.spare = j.msgs[:0]
		}
	}
	if l.ordered {
		l.busy = false
		l.blocked = l.blocked || !ok
		if l.startable() {
			d.queued += len(l.msgs)
			d.enqueue(l)
		}
	}
	if l.keyed && len(l.msgs) == 0 && !l.busy && len(d.lanes) > maxIdleLanes {
		// Idle lanes stay for their key's next message (no allocation per
		// message) until there are many of them.
		delete(d.lanes, l.key)
		*l = lane{ordered: true, keyed: true, spare: l.spare}
		d.free = append(d.free, l)
	}
}

// collect applies the results pushed so far; it reports whether any came.
func (d *dispatcher) collect() bool {
	if d.direct() || d.results == nil {
		return false // every job ran inline
	}
	rs := d.results.take(d.spare)
	defer func() { clear(rs); d.spare = rs[:0] }()
	for _, r := range rs {
		if r.done != nil {
			d.completed(r.done)
		}
		if r.final {
			d.finish(r.j, r.ok)
			*r.j = job{}
			d.freeJobs = append(d.freeJobs, r.j)
		}
	}
	return len(rs) > 0
}

// wait waits for a result, or, with more non-nil, for more input; it
// applies the results, starts what they make startable and reports false
// when the partition is stopping.
func (d *dispatcher) wait(more <-chan struct{}) bool {
	if d.direct() {
		// No call runs but on this goroutine: only more input, or the
		// end, can come.
		select {
		case <-d.ctx.Done():
			return false
		case <-more:
		}
		d.now = time.Now().UnixNano()
		return true
	}
	if !d.schedule(lingered) {
		return false
	}
	var timer <-chan time.Time
	if deadline, ok := d.lingerDeadline(); ok {
		t := time.NewTimer(time.Duration(deadline - time.Now().UnixNano()))
		defer t.Stop()
		timer = t.C
	}
	var results <-chan struct{}
	if d.results != nil {
		results = d.results.ready
	}
	select {
	case <-d.ctx.Done():
		return false
	case <-results:
	case <-more:
	case <-timer:
	}
	d.now = time.Now().UnixNano()
	d.collect()
	return d.schedule(lingered)
}

// lingerDeadline is when the first lingering batch is due, if a lane
// waits for its linger and a call slot is free.
func (d *dispatcher) lingerDeadline() (int64, bool) {
	if d.linger == 0 || d.inflight >= d.maxInFlight {
		return 0, false
	}
	first, ok := int64(0), false
	for _, l := range d.ready {
		if l.startable() && (!ok || l.since < first) {
			first, ok = l.since, true
		}
	}
	return first + d.linger, ok
}

// flush ends a decoded batch: it starts what can start, then copies the
// messages still waiting out of the batch's response so that it can be
// released. It reports false when the loop must end.
func (d *dispatcher) flush() bool {
	if d.direct() {
		return true // every message was handled as it came
	}
	// Lanes whose jobs ended take their new messages as jobs now, instead
	// of copying them out as if their key were still in a call.
	d.collect()
	if !d.schedule(lingered) {
		return false
	}
	var n int64
	for _, l := range d.attachedLanes {
		n += d.detach(l)
	}
	clear(d.attachedLanes)
	d.attachedLanes = d.attachedLanes[:0]
	d.p.env.fetcher.hold(d.p, n) // counted in the budget while they wait
	return true
}

// detach copies l's attached messages out of their response and returns
// their size.
func (d *dispatcher) detach(l *lane) int64 {
	var n int64
	for i := len(l.msgs) - l.attached; i < len(l.msgs); i++ {
		copyMessage(&l.msgs[i])
		n += messageSize(&l.msgs[i])
	}
	l.attached = 0
	l.detached += n
	return n
}

// settle runs every message the window holds to completion: before a
// reset or a stall; or, once the partition is stopping (drain), those below an
// offset done (schedule), under the Handler's context, until DrainTimeout.
// It reports false if it had to stop first.
func (d *dispatcher) settle(drain bool) bool {
	if d.direct() {
		// Nothing waits and nothing is in a call: every message added
		// was handled before add returned.
		return !d.p.abandoned.Load() && (drain || d.ctx.Err() == nil)
	}
	for {
		d.collect()
		if d.p.abandoned.Load() {
			return false
		}
		if !drain && d.ctx.Err() != nil {
			return false
		}
		if d.hctx.Err() == nil {
			if !d.schedule(anySize) {
				return false
			}
		}
		if d.inflight == 0 {
			return d.waiting == 0
		}
		if drain {
			<-d.results.ready
		} else if !d.wait(nil) {
			return false
		}
	}
}

// close ends the run's calls and zeroes the partition's InFlight and
// Waiting.
func (d *dispatcher) close() {
	if !d.direct() {
		d.closeQueues()
	}
	d.p.st.inFlight.Store(0)
	d.p.st.waiting.Store(0)
}

// closeQueues ends the workers once their jobs returned, then drops what
// still waits in the lanes and gives its bytes back to the fetch budget.
func (d *dispatcher) closeQueues() {
	if d.runq != nil {
		d.runq.close()
	}
	d.wg.Wait()
	d.collect()
	for _, l := range append([]*lane{d.seq, d.shared}, mapValues(d.lanes)...) {
		if l == nil {
			continue
		}
		d.p.env.fetcher.release(d.p, l.detached)
		l.msgs, l.spare, l.detached, l.attached = nil, nil, 0, 0
	}
}

func mapValues[K comparable, V any](m map[K]V) []V {
	out := make([]V, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// messageSize is what a message holds in memory beyond its struct.
func messageSize(m *kafka.Message) int64 {
	n := len(m.Key) + len(m.Value)
	for _, h := range m.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}

// copyMessage gives m bytes of its own, in one allocation, instead of
// slices of the fetched response.
func copyMessage(m *kafka.Message) {
	buf := make([]byte, 0, messageSize(m))
	take := func(b []byte) []byte {
		if b == nil {
			return nil
		}
		buf = append(buf, b...)
		return buf[len(buf)-len(b) : len(buf) : len(buf)]
	}
	m.Key, m.Value = take(m.Key), take(m.Value)
	if len(m.Headers) > 0 {
		hs := make([]kafka.Header, len(m.Headers))
		for i, h := range m.Headers {
			hs[i] = kafka.Header{Key: h.Key, Value: take(h.Value)}
		}
		m.Headers = hs
	}
}
