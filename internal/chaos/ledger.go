package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Ledger files. Each consumer process (one incarnation of an instance)
// appends to its own ledger, one line per record:
//
//	H <unix-ns> <topic> <partition> <offset> <value> <instance> <run> <generation>
//	G <unix-ns> <generation> <member>
//
// H: the handler handled a message; the time is taken when the call began,
// the generation is the consumer group generation the call ran in. G: the
// consumer saw a new generation (sampled from Stats every few
// milliseconds). Fields never contain spaces.
//
// A line is written with one write(2) before the handler returns, so a
// process kill cannot lose it: the kernel has it. fsync runs in batches
// (every SyncEvery) and on close; it only matters for a machine crash,
// which the harness does not simulate. A line cut short (a crash
// mid-write) is counted as torn and otherwise ignored.

// Inc names one incarnation: one process run of a consumer instance.
type Inc struct {
	Instance string
	Run      int
}

func (i Inc) String() string { return fmt.Sprintf("%s#%d", i.Instance, i.Run) }

// Handling is one H line: a handled message.
type Handling struct {
	T         int64 // unix ns when the Handler call began
	Topic     string
	Partition int
	Offset    int64
	Value     string
	Inc       Inc
	Gen       int32
}

// GenEvent is one G line: the incarnation entered a generation.
type GenEvent struct {
	T      int64
	Gen    int32
	Member string
}

// Ledger is a parsed ledger file.
type Ledger struct {
	Path      string
	Handlings []Handling
	Gens      []GenEvent
	// Lost are the times the process gave partitions up without a commit
	// (Stats.PartitionsLost grew): its membership lapsed or was fenced.
	Lost []int64
	// Torn counts lines that did not parse.
	Torn int
}

// SyncEvery is how often a LedgerWriter fsyncs what was written since.
const SyncEvery = 50 * time.Millisecond

// LedgerWriter appends to a ledger file; safe for concurrent use. It runs
// one goroutine (the batch fsync) until Close.
type LedgerWriter struct {
	f    *os.File
	inc  Inc
	stop chan struct{}
	done chan struct{}

	mu      sync.Mutex
	dirty   bool
	syncErr error
}

// OpenLedger creates (or appends to) the ledger at path for inc.
func OpenLedger(path string, inc Inc) (*LedgerWriter, error) {
	if strings.ContainsAny(inc.Instance, " \n") || inc.Instance == "" {
		return nil, fmt.Errorf("chaos: ledger %s: invalid instance name %q", path, inc.Instance)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("chaos: opening ledger: %w", err)
	}
	w := &LedgerWriter{f: f, inc: inc, stop: make(chan struct{}), done: make(chan struct{})}
	go w.syncLoop()
	return w, nil
}

func (w *LedgerWriter) syncLoop() {
	defer close(w.done)
	t := time.NewTicker(SyncEvery)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.sync()
		}
	}
}

func (w *LedgerWriter) sync() {
	w.mu.Lock()
	dirty := w.dirty
	w.dirty = false
	w.mu.Unlock()
	if !dirty {
		return
	}
	if err := w.f.Sync(); err != nil {
		w.mu.Lock()
		w.syncErr = err
		w.mu.Unlock()
	}
}

func (w *LedgerWriter) write(line []byte) error {
	if _, err := w.f.Write(line); err != nil {
		return fmt.Errorf("chaos: writing ledger %s: %w", w.f.Name(), err)
	}
	w.mu.Lock()
	w.dirty = true
	err := w.syncErr
	w.mu.Unlock()
	if err != nil {
		return fmt.Errorf("chaos: syncing ledger %s: %w", w.f.Name(), err)
	}
	return nil
}

// Handled appends an H line.
func (w *LedgerWriter) Handled(t time.Time, topic string, partition int, offset int64, value []byte, gen int32) error {
	if bytes.ContainsAny(value, " \n") || len(value) == 0 {
		return fmt.Errorf("chaos: %s/%d@%d: value %q cannot go in a ledger line", topic, partition, offset, value)
	}
	line := make([]byte, 0, 96)
	line = append(line, "H "...)
	line = strconv.AppendInt(line, t.UnixNano(), 10)
	line = append(line, ' ')
	line = append(line, topic...)
	line = append(line, ' ')
	line = strconv.AppendInt(line, int64(partition), 10)
	line = append(line, ' ')
	line = strconv.AppendInt(line, offset, 10)
	line = append(line, ' ')
	line = append(line, value...)
	line = append(line, ' ')
	line = append(line, w.inc.Instance...)
	line = append(line, ' ')
	line = strconv.AppendInt(line, int64(w.inc.Run), 10)
	line = append(line, ' ')
	line = strconv.AppendInt(line, int64(gen), 10)
	line = append(line, '\n')
	return w.write(line)
}

// Generation appends a G line.
func (w *LedgerWriter) Generation(t time.Time, gen int32, member string) error {
	if member == "" {
		member = "-"
	}
	member = strings.Map(func(r rune) rune {
		if r == ' ' || r == '\n' {
			return '_'
		}
		return r
	}, member)
	return w.write(fmt.Appendf(nil, "G %d %d %s\n", t.UnixNano(), gen, member))
}

// Lost appends an L line: the process gave n more partitions up without a
// commit (Stats.PartitionsLost).
func (w *LedgerWriter) Lost(t time.Time, n uint64) error {
	return w.write(fmt.Appendf(nil, "L %d %d\n", t.UnixNano(), n))
}

// Close stops the batch fsync, fsyncs and closes the file.
func (w *LedgerWriter) Close() error {
	close(w.stop)
	<-w.done
	err := w.f.Sync()
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.mu.Lock()
	if err == nil {
		err = w.syncErr
	}
	w.mu.Unlock()
	if err != nil {
		return fmt.Errorf("chaos: closing ledger: %w", err)
	}
	return nil
}

// ReadLedger parses the ledger at path. A last line without its newline
// (a crash mid-write) is counted in Torn and skipped; any complete line
// that does not parse is an error.
func ReadLedger(path string) (Ledger, error) {
	l := Ledger{Path: path}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return l, nil
	}
	if err != nil {
		return l, fmt.Errorf("chaos: reading ledger: %w", err)
	}
	if i := bytes.LastIndexByte(data, '\n'); i < len(data)-1 {
		l.Torn++
		data = data[:i+1]
	}
	n := 0
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		line := data[:i]
		data = data[i+1:]
		n++
		if err := l.parse(string(line)); err != nil {
			return l, fmt.Errorf("chaos: ledger %s line %d: %w", path, n, err)
		}
	}
	return l, nil
}

func (l *Ledger) parse(line string) error {
	f := strings.Fields(line)
	if len(f) == 0 {
		return errors.New("empty line")
	}
	switch f[0] {
	case "H":
		if len(f) != 9 {
			return fmt.Errorf("H line with %d fields", len(f))
		}
		t, err1 := strconv.ParseInt(f[1], 10, 64)
		p, err2 := strconv.Atoi(f[3])
		o, err3 := strconv.ParseInt(f[4], 10, 64)
		run, err4 := strconv.Atoi(f[7])
		gen, err5 := strconv.ParseInt(f[8], 10, 32)
		if err := errors.Join(err1, err2, err3, err4, err5); err != nil {
			return err
		}
		l.Handlings = append(l.Handlings, Handling{
			T: t, Topic: f[2], Partition: p, Offset: o, Value: f[5], Inc: Inc{Instance: f[6], Run: run}, Gen: int32(gen),
		})
	case "G":
		if len(f) != 4 {
			return fmt.Errorf("G line with %d fields", len(f))
		}
		t, err1 := strconv.ParseInt(f[1], 10, 64)
		gen, err2 := strconv.ParseInt(f[2], 10, 32)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		l.Gens = append(l.Gens, GenEvent{T: t, Gen: int32(gen), Member: f[3]})
	case "L":
		if len(f) != 3 {
			return fmt.Errorf("L line with %d fields", len(f))
		}
		t, err1 := strconv.ParseInt(f[1], 10, 64)
		_, err2 := strconv.ParseUint(f[2], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return err
		}
		l.Lost = append(l.Lost, t)
	default:
		return fmt.Errorf("unknown record %q", f[0])
	}
	return nil
}
