package framework

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// The restore's fencing rule and its start decisions (restore.go: trusted,
// counts, the choices of prepare), against random histories of one
// partition: three members, each with its offset file, own it in turn; an
// owner handles runs of random length (a counter per key), sends its
// outbox in random batches, commits as far as the changelog acknowledged,
// and stops gracefully, crashes (possibly after a batch landed but before
// the file recorded its acknowledgement), or goes on as a zombie (handling
// and writing, never committing) while its successor runs. Every start
// must yield the state as of where the partition resumes: the count of
// each key's messages below it; and at the end a member with an empty
// file restores the state as of Kafka's committed offset.
func TestRestoreModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var seen [4]int // starts trusting the file, full restores, incremental ones; zombie writes
	for h := range 400 {
		rng := rand.New(rand.NewPCG(seed, uint64(h)))
		m := newRestoreSim(rng, 600)
		m.run(t, 120)
		if t.Failed() {
			t.Fatalf("history %d (seed %d) failed:\n%s", h, seed, m.trace())
		}
		for i, n := range m.seen {
			seen[i] += n
		}
	}
	t.Logf("400 histories: %d starts trusting the file, %d full restores, %d incremental ones, %d zombie writes", seen[0], seen[1], seen[2], seen[3])
	for i, n := range seen {
		if n == 0 {
			t.Errorf("no history exercised case %d of (trusted, full, incremental, zombie write)", i)
		}
	}
}

type simEntry struct {
	src   int64
	key   string
	value uint64 // 0: a delete
}

// count is the handler: a key's count goes up by one, and is deleted
// each time it reaches 7 (so that restores meet tombstones).
func count(state map[string]uint64, key string) {
	if n := state[key] + 1; n%7 == 0 {
		delete(state, key)
	} else {
		state[key] = n
	}
}

// simFile is a member's offset file: the state as of its watermark L, the
// outbox, the changelog position.
type simFile struct {
	state  map[string]uint64
	L      int64
	pos    offsetfile.ChangelogPosition
	outbox []simEntry
}

// simOwner is one incarnation of a member owning the partition.
type simOwner struct {
	member  int
	epoch   int64
	alive   bool // handles and writes
	current bool // the group's owner: may commit
}

type restoreSim struct {
	rng    *rand.Rand
	keys   []string // each message's key
	log    []logEntry
	C      int64
	files  [3]*simFile
	owners []*simOwner
	events []string
	seen   [4]int
}

func newRestoreSim(rng *rand.Rand, n int) *restoreSim {
	m := &restoreSim{rng: rng, C: -1}
	for range n {
		m.keys = append(m.keys, fmt.Sprintf("k%d", rng.IntN(6)))
	}
	for i := range m.files {
		m.files[i] = &simFile{state: map[string]uint64{}, L: -1, pos: offsetfile.NoChangelogPosition()}
	}
	return m
}

func (m *restoreSim) note(format string, args ...any) {
	m.events = append(m.events, fmt.Sprintf(format, args...))
}

func (m *restoreSim) trace() string {
	out := ""
	for _, e := range m.events {
		out += e + "\n"
	}
	return out
}

// read returns the changelog's records at offsets from..to.
func (m *restoreSim) read(from, to int64) []logEntry { return m.log[from:to] }

// truth is the state as of offset x: each key's messages below it.
func (m *restoreSim) truth(x int64) map[string]uint64 {
	out := map[string]uint64{}
	for i := int64(0); i < x && i < int64(len(m.keys)); i++ {
		count(out, m.keys[i])
	}
	return out
}

func (m *restoreSim) current() *simOwner {
	for _, o := range m.owners {
		if o.current {
			return o
		}
	}
	return nil
}

func (m *restoreSim) run(t *testing.T, steps int) {
	for range steps {
		cur := m.current()
		var alive []*simOwner
		for _, o := range m.owners {
			if o.alive {
				alive = append(alive, o)
			}
		}
		switch r := m.rng.IntN(100); {
		case cur == nil || r < 8:
			if cur != nil {
				switch m.rng.IntN(3) {
				case 0:
					m.stop(cur)
				case 1:
					cur.alive, cur.current = false, false
					m.note("crash of member %d", cur.member)
				default:
					cur.current = false
					m.note("member %d is a zombie", cur.member)
				}
			}
			m.start(t, m.rng.IntN(len(m.files)))
		case r < 45:
			m.handle(m.writer(cur, alive))
		case r < 80:
			m.send(m.writer(cur, alive))
		default:
			m.commit(cur)
		}
		if t.Failed() {
			return
		}
	}
	// A member with an empty file restores the state as of C.
	view, _ := restoreView(nil, m.read(0, int64(len(m.log))), m.C)
	got := map[string]uint64{}
	for k, r := range view {
		if !r.del {
			var n uint64
			fmt.Sscan(string(r.value), &n)
			got[k] = n
		}
	}
	if want := m.truth(m.C); !maps.Equal(got, want) {
		t.Errorf("a fresh restore at C=%d: %v, want %v", m.C, got, want)
	}
}

// restoreView is what prepare applies: each key's last change that counts
// toward the state as of cut, in changelog order.
func restoreView(earlier []offsetfile.ChangelogMarker, recs []logEntry, cut int64) (map[string]logEntry, []offsetfile.ChangelogMarker) {
	markers := restoreMarkers(earlier, recs)
	view := map[string]logEntry{}
	for _, r := range recs {
		if counts(r, markers, cut) {
			view[string(r.key)] = r
		}
	}
	return view, markers
}

// writer picks who handles or writes next: any live owner, zombies
// included.
func (m *restoreSim) writer(_ *simOwner, alive []*simOwner) *simOwner {
	return alive[m.rng.IntN(len(alive))]
}

// handle applies a run of o's next messages to its file.
func (m *restoreSim) handle(o *simOwner) {
	f := m.files[o.member]
	first := max(f.L, 0)
	n := int64(1 + m.rng.IntN(20))
	end := min(first+n, int64(len(m.keys)))
	if end <= first {
		return
	}
	changed := map[string]bool{}
	for i := first; i < end; i++ {
		count(f.state, m.keys[i])
		changed[m.keys[i]] = true
	}
	for _, k := range slices.Sorted(maps.Keys(changed)) {
		f.outbox = append(f.outbox, simEntry{src: first, key: k, value: f.state[k]})
	}
	f.L = end
	m.note("member %d (epoch %d) handles [%d, %d)", o.member, o.epoch, first, end)
}

// send writes a batch of o's outbox; it lands, and is acknowledged unless
// o crashes first.
func (m *restoreSim) send(o *simOwner) {
	f := m.files[o.member]
	if len(f.outbox) == 0 {
		return
	}
	n := 1 + m.rng.IntN(len(f.outbox))
	base := int64(len(m.log))
	for _, e := range f.outbox[:n] {
		r := logEntry{at: int64(len(m.log)), epoch: o.epoch, src: e.src, key: []byte(e.key), value: encodeCount(e.value)}
		r.del = e.value == 0
		m.log = append(m.log, r)
	}
	if m.rng.IntN(8) == 0 {
		o.alive, o.current = false, false
		m.note("member %d (epoch %d) writes %d changes at %d and crashes before recording the acknowledgement", o.member, o.epoch, n, base)
		return
	}
	if !o.current {
		m.seen[3]++
	}
	if base != f.pos.Next {
		f.pos.Gap = true
	}
	f.pos.Next, f.pos.Acked = base+int64(n), f.outbox[n-1].src
	f.outbox = f.outbox[n:]
	m.note("member %d (epoch %d) writes %d changes at %d", o.member, o.epoch, n, base)
}

func encodeCount(n uint64) []byte { return []byte(fmt.Sprint(n)) }

// commit moves Kafka's committed offset as the committer would: to the
// file's watermark, capped by the oldest unacknowledged change.
func (m *restoreSim) commit(o *simOwner) {
	if o == nil || !o.alive {
		return
	}
	f := m.files[o.member]
	w := f.L
	if len(f.outbox) > 0 {
		w = min(w, f.outbox[0].src)
	}
	if w > m.C {
		m.C = w
		m.note("member %d commits %d", o.member, w)
	}
}

// stop is a graceful revoke: the outbox sent, the watermark committed.
func (m *restoreSim) stop(o *simOwner) {
	for len(m.files[o.member].outbox) > 0 && o.alive {
		m.send(o)
	}
	if o.alive {
		m.commit(o)
	}
	o.alive, o.current = false, false
	m.note("member %d stops", o.member)
}

// marker writes an owner's marker and returns its epoch.
func (m *restoreSim) marker(f *simFile, start int64) int64 {
	at := int64(len(m.log))
	m.log = append(m.log, logEntry{at: at, marker: true, start: start})
	if at != f.pos.Next {
		f.pos.Gap = true
	}
	return at
}

// start makes member the owner, as changelog.prepare does.
func (m *restoreSim) start(t *testing.T, member int) {
	for _, o := range m.owners {
		if o.member == member {
			o.alive, o.current = false, false // one process per file
		}
	}
	f := m.files[member]
	L, C := f.L, m.C
	start := C
	switch {
	case L >= 0 && L >= C:
		start = L
	case L < 0 && C < 0:
		start = 0
	}
	pos := f.pos
	end := int64(len(m.log))
	from := pos.Next
	if pos.Epoch < 0 {
		from = 0
	}
	trust := (start == L || (L < 0 && C < 0)) && trusted(pos, m.read(from, end))
	o := &simOwner{member: member, alive: true, current: true}
	m.owners = append(m.owners, o)
	if trust {
		f.pos.Next = max(end, f.pos.Next)
		o.epoch = m.marker(f, start)
		f.pos.Markers = append(slices.Clip(f.pos.Markers), offsetfile.ChangelogMarker{Epoch: o.epoch, Start: start})
		f.pos.Epoch, f.pos.Start, f.pos.Next = o.epoch, start, o.epoch+1
		if f.L < 0 {
			f.L = start
		}
		m.seen[0]++
		m.note("member %d starts at %d trusting its file (epoch %d)", member, start, o.epoch)
		if want := m.truth(start); !maps.Equal(f.state, want) {
			t.Errorf("member %d trusted its file at %d: %v, want %v", member, start, f.state, want)
		}
		return
	}
	resume := max(C, 0)
	o.epoch = m.marker(f, resume)
	incremental := !pos.Gap && pos.Epoch >= 0 && L >= 0 && C > L
	from = 0
	if incremental {
		from = pos.Next
	}
	recs := m.read(from, o.epoch)
	earlier := pos.Markers
	if incremental {
		owners := 0
		for _, r := range recs {
			if r.marker {
				owners++
				if r.start < L {
					incremental = false
				}
			}
		}
		incremental = incremental && owners > 0
		if !incremental {
			recs, earlier = m.read(0, o.epoch), nil
		}
	} else {
		earlier = nil
	}
	view, markers := restoreView(earlier, recs, resume)
	state := map[string]uint64{}
	if incremental {
		state = maps.Clone(f.state)
	}
	for k, r := range view {
		if r.del {
			delete(state, k)
			continue
		}
		var n uint64
		fmt.Sscan(string(r.value), &n)
		state[k] = n
	}
	f.state, f.L, f.outbox = state, resume, nil
	f.pos = offsetfile.ChangelogPosition{Epoch: o.epoch, Start: resume, Next: o.epoch + 1, Acked: -1,
		Markers: append(markers, offsetfile.ChangelogMarker{Epoch: o.epoch, Start: resume})}
	// The keys whose last record the restore ignored are written again
	// (restore.go): later restores must count the rewrite.
	repairs := repairKeys(recs, markers, resume)
	for _, k := range repairs {
		n, ok := state[k]
		m.log = append(m.log, logEntry{at: int64(len(m.log)), epoch: o.epoch, src: resume - 1, key: []byte(k), value: encodeCount(n), del: !ok})
	}
	f.pos.Next += int64(len(repairs))
	if incremental {
		m.seen[2]++
	} else {
		m.seen[1]++
	}
	m.note("member %d restores to %d (local %d, incremental %v, epoch %d)", member, resume, L, incremental, o.epoch)
	if want := m.truth(resume); !maps.Equal(state, want) {
		t.Errorf("member %d restored at %d: %v, want %v", member, resume, state, want)
	}
}
