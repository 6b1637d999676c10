package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	bolt "go.etcd.io/bbolt"

	"github.com/tidemark/tidemark/framework"
	"github.com/tidemark/tidemark/handler"
	"github.com/tidemark/tidemark/internal/inspect"
	"github.com/tidemark/tidemark/internal/offsetfile"
	"github.com/tidemark/tidemark/internal/testsupport"
	"github.com/tidemark/tidemark/internal/testsupport/frameworktest"
)

// A TxHandler's state in the command: inspect's state columns, export and
// import of the state with its record, offline and live.

// stateFixture writes an offset file with the states a TxHandler leaves,
// at fixed times, and returns its path: billing/orders/0 a state of binary
// keys and values; 1 a state with a changelog (position, markers, two
// unsent changes); 2 a changelog side alone, with a gap; 3, billing/
// payments/0 and audit/orders/0 no state.
func stateFixture(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "offsets.db")
	st, err := offsetfile.Open(path, nil)
	must(t, err)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	rec := func(wm int64, s int) offsetfile.Record {
		return offsetfile.Record{Watermark: wm, RecordedAt: at(s), Generation: 4, Member: "tidemark-aaaa", Committed: wm, CommittedAt: at(s)}
	}
	orders := func(p int32) offsetfile.Key { return offsetfile.Key{Group: "billing", Topic: "orders", Partition: p} }
	count := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	must(t, st.PutState(orders(0), rec(120, 1), &offsetfile.StateDump{Entries: []offsetfile.StateEntry{
		{Key: []byte("user:1"), Value: []byte("alice")},
		{Key: []byte{0}, Value: []byte{0xff, 0xfe, 0}},
		{Key: []byte("a"), Value: nil},
	}}))
	must(t, st.PutState(orders(1), rec(183, 2), &offsetfile.StateDump{
		Entries: []offsetfile.StateEntry{{Key: []byte("count"), Value: count(183)}, {Key: []byte("last"), Value: []byte("k9")}},
		Changelog: &offsetfile.ChangelogPosition{Epoch: 4, Start: 100, Next: 57, Acked: 180,
			Markers: []offsetfile.ChangelogMarker{{Epoch: 2, Start: 0}, {Epoch: 4, Start: 100}}},
		Outbox: []offsetfile.OutboxEntry{
			{Seq: 7, Offset: 181, Key: []byte("count"), Value: count(183)},
			{Seq: 8, Offset: 182, Key: []byte("gone"), Delete: true},
		},
	}))
	must(t, st.PutState(orders(2), rec(40, 3), &offsetfile.StateDump{
		Changelog: &offsetfile.ChangelogPosition{Epoch: 1, Start: 0, Next: 10, Acked: 39, Gap: true,
			Markers: []offsetfile.ChangelogMarker{{Epoch: 1, Start: 0}}},
	}))
	must(t, st.Put(orders(3), rec(7, 4)))
	must(t, st.Put(offsetfile.Key{Group: "billing", Topic: "payments", Partition: 0}, rec(9, 5)))
	must(t, st.Put(offsetfile.Key{Group: "audit", Topic: "orders", Partition: 0}, rec(77, 6)))
	must(t, st.Close())
	return path
}

// readFile returns the file's records, states and state sizes.
func readFile(t *testing.T, path string) ([]offsetfile.Entry, map[offsetfile.Key]*offsetfile.StateDump, []offsetfile.StateSize) {
	t.Helper()
	st, err := offsetfile.Open(path, &offsetfile.Options{ReadOnly: true})
	must(t, err)
	defer st.Close()
	states, err := st.DumpStates()
	must(t, err)
	sizes, err := st.StateSizes()
	must(t, err)
	return st.Records(), states, sizes
}

// fileHolds fails t unless the file at path holds recs and states: the
// same records, and the same partitions' states with the same entries,
// changelog positions and outboxes.
func fileHolds(t *testing.T, path string, recs []offsetfile.Entry, states map[offsetfile.Key]*offsetfile.StateDump) {
	t.Helper()
	gotRecs, gotStates, _ := readFile(t, path)
	if len(gotRecs) != len(recs) {
		t.Fatalf("%d records, want %d", len(gotRecs), len(recs))
	}
	for i := range recs {
		a, b := toPartitionDoc(gotRecs[i], nil), toPartitionDoc(recs[i], nil)
		if gotRecs[i].Key != recs[i].Key || !reflect.DeepEqual(a, b) {
			t.Errorf("record %v: %+v, want %v: %+v", gotRecs[i].Key, a, recs[i].Key, b)
		}
	}
	if len(gotStates) != len(states) {
		t.Fatalf("%d partitions with a state, want %d", len(gotStates), len(states))
	}
	for k, d := range gotStates {
		if !equalStates(d, states[k]) {
			t.Errorf("%v: state %+v, want %+v", k, d, states[k])
		}
	}
}

// inspect shows, offline, the state columns in the tables whose
// partitions have a state, with the sizes StateSizes reads, and a gap; the
// tables without a state print as before. --json has them as state_size.
func TestStateInspect(t *testing.T) {
	path := stateFixture(t)
	m := func(s string) string { return mask(s, false, path, "FILE") }
	before := hashFile(t, path)
	r := tidemark(t, "inspect", path).want(t, 0, "STATE-KEYS", "CHANGELOG-NEXT", "partition 2: changelog gap")
	golden(t, "inspect-state", m(r.stdout))
	r = tidemark(t, "inspect", path, "--json").want(t, 0)
	golden(t, "inspect-state.json", m(r.stdout))
	snakeCaseKeys(t, "inspect --json (state)", r.stdout)
	if hashFile(t, path) != before {
		t.Fatal("inspect changed the file")
	}

	var doc struct {
		Partitions []struct {
			Group     string
			Topic     string
			Partition int32
			StateSize *stateSizeDoc `json:"state_size"`
		}
	}
	must(t, json.Unmarshal([]byte(r.stdout), &doc))
	_, _, sizes := readFile(t, path)
	want := map[offsetfile.Key]offsetfile.StateSize{}
	for _, sz := range sizes {
		want[sz.Key] = sz
	}
	shown := 0
	for _, p := range doc.Partitions {
		k := offsetfile.Key{Group: p.Group, Topic: p.Topic, Partition: p.Partition}
		w, ok := want[k]
		switch got := p.StateSize; {
		case got == nil && ok:
			t.Errorf("%v: no state_size, want %+v", k, w)
		case got == nil:
		case !ok:
			t.Errorf("%v: state_size %+v for a partition without a state", k, got)
		case got.Keys != w.Keys || got.Bytes != w.Bytes || !reflect.DeepEqual(got.ChangelogPosition, toPositionDoc(w.Changelog)) ||
			(got.OutboxEntries == nil) != (w.Outbox < 0) || got.OutboxEntries != nil && *got.OutboxEntries != w.Outbox:
			t.Errorf("%v: state_size %+v, want %+v", k, got, w)
		default:
			shown++
		}
	}
	if shown != 3 || len(sizes) != 3 {
		t.Errorf("%d partitions show their state size, the file has %d; want 3", shown, len(sizes))
	}
	// The sizes are what the state holds: keys and values' bytes.
	if w := want[offsetfile.Key{Group: "billing", Topic: "orders", Partition: 0}]; w.Keys != 3 || w.Bytes != int64(len("user:1alice")+1+3+1) {
		t.Errorf("billing/orders/0: %+v, want 3 keys of 16 bytes", w)
	}
}

// export writes each partition's state with its record; import into an
// empty file writes them back, the same entries, changelog positions,
// outboxes and records, and the export of the new file is the same.
// Keys and values of any bytes and at the limits go through.
func TestStateExportImport(t *testing.T) {
	fixedNow(t, t0.Add(time.Hour))
	src := stateFixture(t)
	st, err := offsetfile.Open(src, nil)
	must(t, err)
	big := offsetfile.Key{Group: "billing", Topic: "orders", Partition: 9}
	bin := make([]byte, 256)
	for i := range bin {
		bin[i] = byte(i)
	}
	must(t, st.PutState(big, offsetfile.Record{Watermark: 3, RecordedAt: t0, Committed: -1}, &offsetfile.StateDump{Entries: []offsetfile.StateEntry{
		{Key: bytes.Repeat([]byte{0xff}, offsetfile.MaxStateKey), Value: bytes.Repeat([]byte{0}, offsetfile.MaxStateValue)},
		{Key: bin, Value: bin},
	}}))
	must(t, st.Close())
	recs, states, _ := readFile(t, src)
	if len(states) != 4 {
		t.Fatalf("the file has %d states, want 4", len(states))
	}

	exported := tidemark(t, "export", src).want(t, 0).stdout
	snakeCaseKeys(t, "export (state)", exported)
	in := filepath.Join(t.TempDir(), "offsets.json")
	must(t, os.WriteFile(in, []byte(exported), 0o600))
	// The export's text, without the large partition.
	var doc offsetsDoc
	must(t, json.Unmarshal([]byte(exported), &doc))
	orders := &doc.Groups[1].Topics[0]
	orders.Partitions = orders.Partitions[:len(orders.Partitions)-1]
	var small bytes.Buffer
	must(t, writeJSON(&small, doc))
	golden(t, "export-state.json", mask(small.String(), false, src, "FILE"))

	dst := filepath.Join(t.TempDir(), "offsets.db")
	r := tidemark(t, "import", dst, "--from", in).want(t, 0, "7 partitions: 7 new, 0 changed, 0 unchanged; 0 failure entries added; the state of 4 partitions written whole")
	golden(t, "import-state", mask(r.stdout, false, dst, "FILE"))
	fileHolds(t, dst, recs, states)
	if again := tidemark(t, "export", dst).want(t, 0).stdout; strings.ReplaceAll(again, dst, src) != exported {
		t.Error("the export of the imported file differs from the one imported")
	}
	tidemark(t, "check", dst).want(t, 0, "findings  none", "state     7 entries")

	// Again: nothing changes.
	tidemark(t, "import", dst, "--from", in).want(t, 0, "0 new, 0 changed, 7 unchanged", "billing/orders/1: unchanged: watermark 183, committed 183, state 2 keys")
}

// import replaces a partition's state whole, and refuses, without
// --force, to drop the state of a partition the input lists without one
// (an export of a build before states).
func TestStateImportReplaces(t *testing.T) {
	fixedNow(t, t0.Add(time.Hour))
	path := stateFixture(t)
	var doc offsetsDoc
	must(t, json.Unmarshal([]byte(tidemark(t, "export", path).stdout), &doc))
	orders := doc.Groups[1].Topics[0].Partitions
	b64 := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	orders[0].StateEntries = []stateEntryDoc{{Key: b64("new"), Value: b64("v")}}
	orders[1].StateEntries, orders[1].ChangelogPosition, orders[1].ChangelogOutbox = nil, nil, nil
	b, err := json.Marshal(doc)
	must(t, err)
	in := filepath.Join(t.TempDir(), "edited.json")
	must(t, os.WriteFile(in, b, 0o600))
	before := hashFile(t, path)
	r := tidemark(t, "import", path, "--from", in).want(t, 2,
		"billing/orders/1: REFUSED: the file's state (2 keys, 19 bytes, 2 unsent changelog changes) would be dropped",
		"import refused, nothing written: 1 partition in "+path+" would lose a state (listed above); --force overwrites them")
	golden(t, "import-state-refused", mask(r.stdout+r.stderr, false, path, "FILE"))
	tidemark(t, "import", path, "--from", in, "--force", "--dry-run").want(t, 0,
		"billing/orders/0: watermark 120 -> 120, committed 120 -> 120, state 3 keys, 16 bytes -> 1 key, 4 bytes",
		"billing/orders/1: watermark 183 -> 183, committed 183 -> 183, state 2 keys, 19 bytes, 2 unsent changelog changes -> none (drops the state: --force)",
		"dry run, nothing written")
	if hashFile(t, path) != before {
		t.Fatal("a refused import or a dry run changed the file")
	}
	tidemark(t, "import", path, "--from", in, "--force").want(t, 0, "0 new, 2 changed, 4 unchanged", "the state of 2 partitions written whole")
	_, states, _ := readFile(t, path)
	k := func(p int32) offsetfile.Key { return offsetfile.Key{Group: "billing", Topic: "orders", Partition: p} }
	if d := states[k(0)]; d == nil || len(d.Entries) != 1 || string(d.Entries[0].Key) != "new" || d.Changelog != nil {
		t.Errorf("billing/orders/0 after import: %+v, want the input's one key alone", d)
	}
	if d := states[k(1)]; !d.Empty() {
		t.Errorf("billing/orders/1 after import --force: %+v, want no state", d)
	}
	if d := states[k(2)]; d == nil || d.Changelog == nil || !d.Changelog.Gap {
		t.Errorf("billing/orders/2, unchanged in the input: %+v, want its changelog position kept", d)
	}
}

// A bad state in the input is refused, naming its partition and key, and
// nothing is written.
func TestStateImportBadInput(t *testing.T) {
	fixedNow(t, t0)
	path := stateFixture(t)
	before := hashFile(t, path)
	valid := tidemark(t, "export", path).stdout
	enc := base64.StdEncoding.EncodeToString
	p0, p1 := `group "billing" topic "orders" partition 0: `, `group "billing" topic "orders" partition 1: `
	longKey := enc(bytes.Repeat([]byte("k"), offsetfile.MaxStateKey+1))
	largeValue := enc(make([]byte, offsetfile.MaxStateValue+1))
	// Each edit is of billing/orders/0 (keys "\x00", "a", "user:1") or 1
	// (an outbox of entries 7 and 8, and a changelog position).
	for name, tt := range map[string]struct {
		edit func(p0, p1 *partitionDoc)
		want string
	}{
		"key not base64": {func(p, _ *partitionDoc) { p.StateEntries[1].Key = "a*b" },
			p0 + `state entry 1: key "a*b": not base64: illegal base64 data at input byte 1`},
		"value not base64": {func(p, _ *partitionDoc) { p.StateEntries[2].Value = "YWxp!" },
			p0 + `state key "user:1": value: not base64`},
		"empty key": {func(p, _ *partitionDoc) { p.StateEntries[1].Key = "" },
			p0 + "state: empty key"},
		"long key": {func(p, _ *partitionDoc) { p.StateEntries[1].Key = longKey },
			p0 + `state: key "` + strings.Repeat("k", 64) + `...": 4097 bytes, over the limit of 4096 (MaxStateKey)`},
		"large value": {func(p, _ *partitionDoc) { p.StateEntries[2].Value = largeValue },
			p0 + `state key "user:1": value of 1048577 bytes, over the limit of 1048576 (MaxStateValue)`},
		"key twice": {func(p, _ *partitionDoc) { p.StateEntries[2].Key = p.StateEntries[1].Key },
			p0 + `state key "a" is listed twice`},
		"outbox key": {func(_, p *partitionDoc) { p.ChangelogOutbox[0].Key = "%%" },
			p1 + `changelog outbox entry 7: key "%%": not base64`},
		"outbox value": {func(_, p *partitionDoc) { p.ChangelogOutbox[0].Value = "%%" },
			p1 + `changelog outbox entry 7, key "count": value: not base64`},
		"deletion with value": {func(_, p *partitionDoc) { p.ChangelogOutbox[1].Value = enc([]byte("v")) },
			p1 + "changelog outbox entry 8: a deletion with a value"},
		"position": {func(_, p *partitionDoc) { p.ChangelogPosition.Next = -2 },
			p1 + "changelog position: next -2: must be >= 0"},
	} {
		t.Run(name, func(t *testing.T) {
			var doc offsetsDoc
			must(t, json.Unmarshal([]byte(valid), &doc))
			parts := doc.Groups[1].Topics[0].Partitions
			tt.edit(&parts[0], &parts[1])
			b, err := json.Marshal(doc)
			must(t, err)
			in := filepath.Join(t.TempDir(), "in.json")
			must(t, os.WriteFile(in, b, 0o600))
			tidemark(t, "import", path, "--from", in).want(t, 2, "tidemark: "+in+": "+tt.want)
			tidemark(t, "import", filepath.Join(t.TempDir(), "new.db"), "--from", in, "--dry-run").want(t, 2, tt.want)
		})
	}
	if hashFile(t, path) != before {
		t.Fatal("a refused import changed the file")
	}
}

// export --salvage of a sound file carries the states as export does. A
// state the file holds for a partition without a record has no place in
// the document: stderr names it.
func TestStateExportOrphan(t *testing.T) {
	fixedNow(t, t0)
	path := stateFixture(t)
	want := tidemark(t, "export", path).want(t, 0).stdout
	if got := tidemark(t, "export", "--salvage", path).want(t, 0).stdout; got != want {
		t.Errorf("export --salvage of a sound file:\n%s\nwant:\n%s", got, want)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	must(t, err)
	must(t, db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("groups")).Bucket([]byte("billing")).Bucket([]byte("orders")).Delete([]byte{0, 0, 0, 0})
	}))
	must(t, db.Close())
	const orphan = `group "billing" topic "orders" partition 0 has a state (3 keys) but no record: not exported`
	for _, args := range [][]string{{"export", path}, {"export", "--salvage", path}} {
		r := tidemark(t, args...).want(t, 0, orphan)
		if strings.Contains(r.stdout, "dXNlcjox") { // user:1
			t.Errorf("%q exported the state of a partition without a record", args)
		}
	}
}

// fakeConsumer serves path's records as a running consumer's snapshot
// would, and the state sizes with state (nil: 404, as a build from before
// them), from a side file naming this process.
func fakeConsumer(t *testing.T, path string, state http.HandlerFunc) {
	t.Helper()
	recs, _, _ := readFile(t, path)
	snap, err := json.Marshal(snapshot{Format: inspect.Format, Version: inspect.SnapshotVersion, Pid: os.Getpid(), OffsetFile: path,
		Topics: []string{"orders"}, Started: t0, TakenAt: t0, Stats: framework.Stats{Group: "billing", Generation: 4}, Records: recs})
	must(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+inspect.Path, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write(snap) })
	if state != nil {
		mux.Handle("GET "+inspect.StatePath, state)
	}
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	must(t, inspect.WriteSideFile(path+inspect.SideFileSuffix, &inspect.Endpoint{Version: inspect.Version, Pid: os.Getpid(),
		Network: "tcp", Address: srv.Listener.Addr().String(), Token: "x", OffsetFile: path}))
}

// A running consumer that does not serve the state sizes (a build from
// before them): inspect works, without the state columns, and says why;
// export notes that it carries no state. One that fails to send them:
// inspect says so, and export refuses, since it cannot tell whether the
// consumer keeps state. One that keeps state: export refuses.
func TestStateLiveNotServed(t *testing.T) {
	path := stateFixture(t)
	pid := os.Getpid()

	fakeConsumer(t, path, nil)
	r := tidemark(t, "inspect", path).want(t, 0, "live snapshot from the consumer running as pid",
		"state sizes: not shown: the consumer running as pid "+fmt.Sprint(pid)+" does not serve them (a build from before them)")
	if strings.Contains(r.stdout, "STATE-KEYS") {
		t.Errorf("state columns without state sizes:\n%s", r.stdout)
	}
	r = tidemark(t, "inspect", path, "--json").want(t, 0, `"no_state_sizes": "the consumer running as pid `)
	if strings.Contains(r.stdout, "state_size\"") {
		t.Errorf("state_size without state sizes:\n%s", r.stdout)
	}
	r = tidemark(t, "export", path).want(t, 0, "the export carries no state (a TxHandler's): the consumer running as pid "+fmt.Sprint(pid)+
		" does not say whether it keeps any (a build from before state sizes); if it does, stop it and export the file")
	if strings.Contains(r.stdout, "state_entries") {
		t.Error("a live export carries state entries")
	}

	fakeConsumer(t, path, func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "disk on fire", http.StatusInternalServerError)
	})
	tidemark(t, "inspect", path).want(t, 0, "state sizes: not shown: the consumer running as pid "+fmt.Sprint(pid)+" did not send them: ", "500 Internal Server Error: disk on fire")
	tidemark(t, "export", path).want(t, 2, "which did not say whether it keeps state (a TxHandler's), which a live export cannot carry: ",
		"disk on fire; stop it and export the file")

	_, _, sizes := readFile(t, path)
	fakeConsumer(t, path, func(w http.ResponseWriter, _ *http.Request) {
		b, _ := json.Marshal(inspect.StateSizes{Format: inspect.StateFormat, Version: inspect.StateVersion, TakenAt: t0, Partitions: sizes})
		_, _ = w.Write(b)
	})
	tidemark(t, "inspect", path).want(t, 0, "live snapshot", "STATE-KEYS", "partition 2: changelog gap")
	tidemark(t, "export", path).want(t, 2, "which keeps state (a TxHandler's) in 3 partitions (billing/orders/0, billing/orders/1, billing/orders/2); a live export cannot carry it: stop the consumer and export the file")
	tidemark(t, "export", path, "--group", "audit").want(t, 0, `"group": "audit"`)
}

// stateSizesOf returns the state_size of each partition in inspect --json.
func stateSizesOf(t *testing.T, out string) map[int32]*stateSizeDoc {
	t.Helper()
	var doc struct {
		Partitions []struct {
			Partition int32
			StateSize *stateSizeDoc `json:"state_size"`
		}
	}
	must(t, json.Unmarshal([]byte(out), &doc))
	sizes := map[int32]*stateSizeDoc{}
	for _, p := range doc.Partitions {
		sizes[p.Partition] = p.StateSize
	}
	return sizes
}

// A consumer running a TxHandler with a changelog on the in-process
// broker: inspect shows its partitions' state sizes live, as the file
// holds them once it stopped; export refuses it, since a live export
// cannot carry the state; once it stopped, export and import into an
// empty file carry every state, its changelog position with it.
func TestStateLive(t *testing.T) {
	const parts, perPart, keys = 2, 40, 4
	cl := testsupport.Start(t)
	topic, group := testsupport.Name(t, "t"), testsupport.Name(t, "g")
	cl.CreateTopic(t, topic, parts)
	cl.ProduceKeyed(t, topic, parts, 0, perPart, func(_, seq int) []byte { return fmt.Appendf(nil, "k%d", seq%keys) })
	file := filepath.Join(t.TempDir(), "offsets.db")
	cfg := frameworktest.Config(t, cl.Brokers, group, topic, file, nil)
	cfg.StateChangelog = "-state"
	cfg.TxHandler = handler.TxHandlerFunc(func(_ context.Context, st handler.State, msgs []kafka.Message) error {
		for _, m := range msgs {
			v, err := st.Get(m.Key)
			if err != nil {
				return err
			}
			if err := st.Put(m.Key, binary.BigEndian.AppendUint64(nil, frameworktest.StateCount(v)+1)); err != nil {
				return err
			}
		}
		return nil
	})
	c := frameworktest.Start(t, cfg)
	testsupport.WaitFor(t, 30*time.Second, "the log end committed", func() bool { return frameworktest.CommittedAt(perPart, c) == parts })
	var live map[int32]*stateSizeDoc
	testsupport.WaitFor(t, 30*time.Second, "every change acknowledged by the changelog, in the file", func() bool {
		live = stateSizesOf(t, tidemark(t, "inspect", file, "--json").want(t, 0, `"source": "live"`).stdout)
		for p := range int32(parts) {
			if sz := live[p]; sz == nil || sz.Keys != keys || sz.ChangelogPosition == nil || sz.OutboxEntries == nil || *sz.OutboxEntries != 0 {
				return false
			}
		}
		return true
	})
	r := tidemark(t, "inspect", file).want(t, 0, "live snapshot from the consumer", "STATE-KEYS  STATE-BYTES  CHANGELOG-NEXT  UNSENT  STATE")
	if strings.Contains(r.stdout, "state sizes: not shown") {
		t.Error("the consumer's state sizes are not shown")
	}
	tidemark(t, "export", file).want(t, 2, "which keeps state (a TxHandler's) in 2 partitions (", "a live export cannot carry it: stop the consumer and export the file")

	c.Stop(t)
	off := stateSizesOf(t, tidemark(t, "inspect", file, "--json").want(t, 0, `"source": "file"`).stdout)
	_, states, sizes := readFile(t, file)
	for _, sz := range sizes {
		p := sz.Partition
		if got := off[p]; got == nil || got.Keys != sz.Keys || got.Bytes != sz.Bytes || got.Keys != live[p].Keys || got.Bytes != live[p].Bytes ||
			!reflect.DeepEqual(got.ChangelogPosition, live[p].ChangelogPosition) {
			t.Errorf("partition %d: offline %+v, live %+v, StateSizes %+v", p, got, live[p], sz)
		}
	}
	for k, d := range states {
		for _, e := range d.Entries {
			if n := frameworktest.StateCount(e.Value); n != perPart/keys {
				t.Errorf("%v key %s: counted %d, want %d", k, e.Key, n, perPart/keys)
			}
		}
	}

	in := filepath.Join(t.TempDir(), "offsets.json")
	must(t, os.WriteFile(in, []byte(tidemark(t, "export", file).want(t, 0, `"changelog_position"`, `"state_entries"`).stdout), 0o600))
	dst := filepath.Join(t.TempDir(), "offsets.db")
	tidemark(t, "import", dst, "--from", in).want(t, 0, "2 partitions: 2 new", "the state of 2 partitions written whole")
	recs, _, _ := readFile(t, file)
	fileHolds(t, dst, recs, states)
	tidemark(t, "check", dst).want(t, 0, "findings  none", fmt.Sprintf("state     %d entries", parts*keys))
}
