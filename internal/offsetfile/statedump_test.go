package offsetfile_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// commitState commits one run on k that puts kv (a value "" deletes the
// key), logged when logged is set, with watermark wm.
func commitState(t *testing.T, s *offsetfile.Store, k offsetfile.Key, wm int64, logged bool, kv map[string]string) {
	t.Helper()
	st, err := s.BeginState(k)
	must(t, err)
	for key, v := range kv {
		if v == "" {
			must(t, st.Delete([]byte(key)))
		} else {
			must(t, st.Put([]byte(key), []byte(v)))
		}
	}
	if logged {
		st.LogChanges(wm - 1)
	}
	must(t, st.Commit(context.Background(), wm, 1, "m"))
}

// bigState is n keys of varying lengths, enough for many pages.
func bigState(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("key-%06d", i)] = strings.Repeat("v", i%97+1)
	}
	return m
}

// writeStateFile writes a file with the states of three partitions: p0
// large (many pages), p1 small (an inline bucket) with a changelog
// position and unsent changes, p2 emptied.
func writeStateFile(t *testing.T, path string) {
	t.Helper()
	s, err := offsetfile.Open(path, nil)
	must(t, err)
	k0, k1, k2 := offsetfile.Key{Group: "g", Topic: "t", Partition: 0}, offsetfile.Key{Group: "g", Topic: "t", Partition: 1},
		offsetfile.Key{Group: "g", Topic: "u", Partition: 2}
	commitState(t, s, k0, 100, false, bigState(3000))
	commitState(t, s, k1, 10, true, map[string]string{"a": "1", "b": "22"})
	commitState(t, s, k2, 5, false, map[string]string{"x": "1"})
	must(t, s.Sync(context.Background()))
	must(t, s.AckOutbox(k1, 0, offsetfile.ChangelogPosition{Epoch: 4, Start: 0, Next: 6, Acked: 9,
		Markers: []offsetfile.ChangelogMarker{{Epoch: 4, Start: 0}}}))
	commitState(t, s, k1, 12, true, map[string]string{"c": "333", "a": ""})
	commitState(t, s, k2, 6, false, map[string]string{"x": ""})
	must(t, s.Close())
}

// walkState counts a partition's keys and their bytes through ViewState.
func walkState(t *testing.T, s *offsetfile.Store, k offsetfile.Key) (keys, size int64) {
	t.Helper()
	must(t, s.ViewState(k, func(st *offsetfile.StateTx) error {
		return st.ForEach(func(key, value []byte) error {
			keys++
			size += int64(len(key) + len(value))
			return nil
		})
	}))
	return keys, size
}

// StateSizes counts, from bbolt's page statistics, what a walk of every
// key counts: keys and bytes, for a state of many pages, an inline one and
// an emptied one; and the changelog side: the position and the unsent
// changes.
func TestStateSizes(t *testing.T) {
	path := tempPath(t)
	writeStateFile(t, path)
	s := mustOpen(t, path, &offsetfile.Options{ReadOnly: true})
	sizes, err := s.StateSizes()
	must(t, err)
	if len(sizes) != 3 {
		t.Fatalf("StateSizes: %+v, want 3 partitions", sizes)
	}
	for _, sz := range sizes {
		keys, size := walkState(t, s, sz.Key)
		if sz.Keys != keys || sz.Bytes != size {
			t.Errorf("%v: StateSizes %d keys %d bytes, a walk %d keys %d bytes", sz.Key, sz.Keys, sz.Bytes, keys, size)
		}
		ob, err := s.Outbox(sz.Key, 1<<20)
		must(t, err)
		pos, err := s.ChangelogPosition(sz.Key)
		must(t, err)
		switch sz.Partition {
		case 1:
			if sz.Outbox != int64(len(ob)) || sz.Outbox != 3 || sz.Changelog == nil || !reflect.DeepEqual(*sz.Changelog, pos) {
				t.Errorf("%v: outbox %d (Outbox has %d), position %+v (ChangelogPosition %+v)", sz.Key, sz.Outbox, len(ob), sz.Changelog, pos)
			}
		default:
			if sz.Outbox != -1 || sz.Changelog != nil {
				t.Errorf("%v without a changelog: outbox %d, position %+v", sz.Key, sz.Outbox, sz.Changelog)
			}
		}
	}
	if sizes[0].Keys != 3000 || sizes[2].Keys != 0 {
		t.Errorf("sizes %+v", sizes)
	}
}

// A file's states, dumped and put into another file with their records,
// read back the same, key by key, with the same watermarks; PutState
// replaces what the target held, and a nil dump empties it.
func TestPutStateRoundTrip(t *testing.T) {
	src := tempPath(t)
	writeStateFile(t, src)
	s := mustOpen(t, src, &offsetfile.Options{ReadOnly: true})
	dumps, err := s.DumpStates()
	must(t, err)
	recs := s.Records()
	if len(dumps) != 2 || len(recs) != 3 { // p2's state is empty
		t.Fatalf("%d dumps, %d records; want 2 and 3", len(dumps), len(recs))
	}

	dst := tempPath(t)
	d := mustOpen(t, dst, nil)
	// What the target held before: other keys, another outbox.
	for _, e := range recs {
		commitState(t, d, e.Key, 1, true, map[string]string{"old": "x", "key-000001": "old"})
	}
	must(t, d.Sync(context.Background()))
	for _, e := range recs {
		must(t, d.PutState(e.Key, e.Record, dumps[e.Key]))
	}
	must(t, d.Close())

	d = mustOpen(t, dst, &offsetfile.Options{ReadOnly: true})
	got, err := d.DumpStates()
	must(t, err)
	if !reflect.DeepEqual(got, dumps) {
		for k := range dumps {
			if !reflect.DeepEqual(got[k], dumps[k]) {
				t.Errorf("%v: imported %d entries, %d outbox entries, position %+v; exported %d, %d, %+v", k,
					len(got[k].Entries), len(got[k].Outbox), got[k].Changelog, len(dumps[k].Entries), len(dumps[k].Outbox), dumps[k].Changelog)
			}
		}
		t.Fatalf("imported states of %d partitions, exported %d", len(got), len(dumps))
	}
	for _, e := range recs {
		r, ok := d.Get(e.Key)
		if !ok || !recordsEqual(r, e.Record) {
			t.Errorf("%v: record %+v, want %+v", e.Key, r, e.Record)
		}
		want := stateOf(t, s, e.Key)
		if got := stateOf(t, d, e.Key); !reflect.DeepEqual(got, want) {
			t.Errorf("%v: ViewState reads %d keys, want %d", e.Key, len(got), len(want))
		}
	}
	if rep, err := offsetfile.Check(src, nil); err != nil || rep.Worst() != 0 {
		t.Fatalf("Check: %v %v", rep.Findings, err)
	}
	must(t, d.Close())

	// The next run reads the imported state; the outbox numbering goes on.
	d = mustOpen(t, dst, nil)
	k1 := offsetfile.Key{Group: "g", Topic: "t", Partition: 1}
	commitState(t, d, k1, 13, true, map[string]string{"d": "4"})
	must(t, d.Sync(context.Background()))
	ob, err := d.Outbox(k1, 10)
	must(t, err)
	if n := len(ob); n != 4 || ob[n-1].Seq != ob[n-2].Seq+1 || string(ob[n-1].Key) != "d" {
		t.Errorf("outbox after a run: %+v", ob)
	}
	must(t, d.PutState(k1, offsetfile.Record{Watermark: 13, Committed: -1}, nil))
	must(t, d.Sync(context.Background()))
	if m := stateOf(t, d, k1); len(m) != 0 {
		t.Errorf("a nil dump left %v", m)
	}
	if sizes, _ := d.StateSizes(); len(sizes) != 1 || sizes[0].Partition != 0 {
		t.Errorf("after a nil dump: sizes %+v", sizes)
	}
}

// PutState refuses what a consumer could not have written, naming the
// partition, and queues nothing then.
func TestPutStateRefuses(t *testing.T) {
	s := mustOpenStore(t, nil)
	k := offsetfile.Key{Group: "g", Topic: "orders", Partition: 3}
	rec := offsetfile.Record{Watermark: 5, Committed: -1}
	for _, c := range []struct {
		name string
		d    offsetfile.StateDump
		want string
	}{
		{"empty key", offsetfile.StateDump{Entries: []offsetfile.StateEntry{{Key: nil, Value: []byte("v")}}}, "empty key"},
		{"long key", offsetfile.StateDump{Entries: []offsetfile.StateEntry{{Key: bytes.Repeat([]byte("k"), offsetfile.MaxStateKey+1)}}},
			`state: key "` + strings.Repeat("k", 64) + `...": 4097 bytes, over the limit of 4096 (MaxStateKey)`},
		{"large value", offsetfile.StateDump{Entries: []offsetfile.StateEntry{{Key: []byte("k"), Value: make([]byte, offsetfile.MaxStateValue+1)}}}, "MaxStateValue"},
		{"twice", offsetfile.StateDump{Entries: []offsetfile.StateEntry{{Key: []byte("k")}, {Key: []byte("k")}}}, "listed twice"},
		{"outbox twice", offsetfile.StateDump{Outbox: []offsetfile.OutboxEntry{{Seq: 1, Key: []byte("k")}, {Seq: 1, Key: []byte("j")}}}, "listed twice"},
		{"deletion with a value", offsetfile.StateDump{Outbox: []offsetfile.OutboxEntry{{Seq: 1, Key: []byte("k"), Value: []byte("v"), Delete: true}}}, "deletion with a value"},
		{"negative next", offsetfile.StateDump{Changelog: &offsetfile.ChangelogPosition{Epoch: -1, Start: -1, Next: -2, Acked: -1}}, "next -2"},
	} {
		err := s.PutState(k, rec, &c.d)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "orders") {
			t.Errorf("%s: PutState = %v, want an error naming %q and the topic", c.name, err, c.want)
		}
	}
	flush(t, s)
	if _, ok := s.Get(k); ok {
		t.Error("a refused PutState queued its record")
	}
}

// Check decodes every state value's format byte: a damaged one is an
// error naming the partition and the key, and Open refuses the file.
func TestCheckStateValue(t *testing.T) {
	path := tempPath(t)
	writeStateFile(t, path)
	writeBolt(t, path, nil, func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("state")).Bucket([]byte("g")).Bucket([]byte("t")).Bucket([]byte{0, 0, 0, 1})
		return b.Put([]byte("b"), []byte{9, '2', '2'}) // format 9: no such format
	})
	rep, err := offsetfile.Check(path, nil)
	must(t, err)
	if len(rep.Findings) != 1 || rep.Findings[0].Severity != offsetfile.SeverityError ||
		!strings.Contains(rep.Findings[0].Message, `state key "b"`) || rep.Findings[0].Key == nil || rep.Findings[0].Key.Partition != 1 {
		t.Fatalf("a damaged state value: findings %v", rep.Findings)
	}
	if _, err := offsetfile.Open(path, nil); !errors.Is(err, offsetfile.ErrDamaged) || !strings.Contains(err.Error(), `state key "b"`) {
		t.Fatalf("Open of a file with a damaged state value: %v, want ErrDamaged naming the key", err)
	}
	// Salvage leaves that partition's state out, and says so; the others'
	// it carries whole.
	sv := salvage(t, path)
	if _, ok := sv.States[offsetfile.Key{Group: "g", Topic: "t", Partition: 1}]; ok || len(sv.States) != 1 ||
		!strings.Contains(strings.Join(sv.Problems, "\n"), "partition 1: its state is not exported") {
		t.Errorf("Salvage: states of %d partitions, problems %q", len(sv.States), sv.Problems)
	}
}

// Salvage carries the states of a file: of a sound one, all of them,
// as DumpStates reads them; of one whose page in a state is damaged, all
// but that partition's, which it names.
func TestSalvageStates(t *testing.T) {
	path := tempPath(t)
	writeStateFile(t, path)
	s, err := offsetfile.Open(path, &offsetfile.Options{ReadOnly: true}) // not mustOpen: its cleanup checks the file, damaged then
	must(t, err)
	want, err := s.DumpStates()
	must(t, err)
	must(t, s.Close())
	sv := salvage(t, path)
	if len(sv.Problems) != 0 || !reflect.DeepEqual(sv.States, want) {
		t.Fatalf("Salvage of a sound file: states of %d partitions (want %d), problems %q", len(sv.States), len(want), sv.Problems)
	}

	// Overwrite the root page of p0's state (thousands of keys: a tree of
	// its own).
	var root, pageSize int
	db, err := bolt.Open(path, 0, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	must(t, err)
	must(t, db.View(func(tx *bolt.Tx) error {
		root = int(tx.Bucket([]byte("state")).Bucket([]byte("g")).Bucket([]byte("t")).Bucket([]byte{0, 0, 0, 0}).Root())
		pageSize = db.Info().PageSize
		return nil
	}))
	must(t, db.Close())
	if root == 0 {
		t.Fatal("p0's state is an inline bucket")
	}
	b, err := os.ReadFile(path)
	must(t, err)
	copy(b[root*pageSize:(root+1)*pageSize], bytes.Repeat([]byte{0xA5}, pageSize))
	must(t, os.WriteFile(path, b, 0o600))
	sv = salvage(t, path)
	k0, k1 := offsetfile.Key{Group: "g", Topic: "t", Partition: 0}, offsetfile.Key{Group: "g", Topic: "t", Partition: 1}
	if _, ok := sv.States[k0]; ok || !reflect.DeepEqual(sv.States[k1], want[k1]) ||
		!strings.Contains(strings.Join(sv.Problems, "\n"), "partition 0: its state is not exported") {
		t.Errorf("Salvage with p0's state damaged: states %v, problems %q", sv.States, sv.Problems)
	}
	if len(sv.Records) != 3 {
		t.Errorf("Salvage read %d records, want 3", len(sv.Records))
	}
}
