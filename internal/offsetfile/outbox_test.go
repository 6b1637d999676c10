package offsetfile_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// A logged run's changes reach the outbox in the checkpoint that writes
// the state and the watermark, survive a reopening, leave it when
// acknowledged (numbering goes on), and a restore's run empties it and
// records its position.
func TestOutbox(t *testing.T) {
	path := tempPath(t)
	s := mustOpen(t, path, nil)
	k := offsetfile.Key{Group: "g", Topic: "t", Partition: 2}
	ctx := context.Background()
	commit := func(first, wm int64, log bool, puts map[string]string, dels ...string) {
		t.Helper()
		st, err := s.BeginState(k)
		must(t, err)
		for _, key := range slices.Sorted(maps.Keys(puts)) { // a run's entries keep its order
			must(t, st.Put([]byte(key), []byte(puts[key])))
		}
		for _, key := range dels {
			must(t, st.Delete([]byte(key)))
		}
		if log {
			st.LogChanges(first)
		}
		must(t, st.Commit(ctx, wm, 1, "m"))
	}
	commit(0, 3, true, map[string]string{"b": "2", "a": "1"})
	commit(3, 5, true, nil, "a")
	commit(5, 6, false, map[string]string{"c": "3"}) // not logged
	if _, ok, err := s.OutboxOldest(k); err != nil || ok {
		t.Fatalf("before the checkpoint the outbox must look empty: ok %v err %v", ok, err)
	}
	must(t, s.Sync(ctx))
	must(t, s.Close())

	s = mustOpen(t, path, nil)
	defer s.Close()
	got, err := s.Outbox(k, 10)
	must(t, err)
	want := []offsetfile.OutboxEntry{
		{Seq: 0, Offset: 0, Key: []byte("a"), Value: []byte("1")},
		{Seq: 1, Offset: 0, Key: []byte("b"), Value: []byte("2")},
		{Seq: 2, Offset: 3, Key: []byte("a"), Delete: true},
	}
	if len(got) != len(want) {
		t.Fatalf("outbox %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Seq != w.Seq || g.Offset != w.Offset || string(g.Key) != string(w.Key) || string(g.Value) != string(w.Value) || g.Delete != w.Delete {
			t.Fatalf("entry %d: %+v, want %+v", i, g, w)
		}
	}
	if off, ok, _ := s.OutboxOldest(k); !ok || off != 0 {
		t.Fatalf("oldest %d %v, want 0 true", off, ok)
	}
	pos := offsetfile.ChangelogPosition{Epoch: 7, Start: 0, Next: 10, Acked: 0, Markers: []offsetfile.ChangelogMarker{{Epoch: 7, Start: 0}}}
	// A read of fewer entries than the first run holds, acknowledged: the
	// rest of the run stays, numbered as before.
	if part, err := s.Outbox(k, 1); err != nil || len(part) != 1 || part[0].Seq != 0 {
		t.Fatalf("outbox of at most 1: %+v %v", part, err)
	}
	must(t, s.AckOutbox(k, 0, pos))
	if rest, err := s.Outbox(k, 10); err != nil || len(rest) != 2 || rest[0].Seq != 1 || string(rest[0].Key) != "b" ||
		string(rest[0].Value) != "2" || rest[0].Offset != 0 || rest[1].Seq != 2 || !rest[1].Delete {
		t.Fatalf("after a part of a run acknowledged: %+v %v", rest, err)
	}
	must(t, s.AckOutbox(k, 1, pos))
	if off, ok, _ := s.OutboxOldest(k); !ok || off != 3 {
		t.Fatalf("oldest after the ack %d %v, want 3 true", off, ok)
	}
	must(t, s.AckOutbox(k, 2, pos))
	if _, ok, _ := s.OutboxOldest(k); ok {
		t.Fatal("the outbox must be empty after every entry was acknowledged")
	}
	gotPos, err := s.ChangelogPosition(k)
	must(t, err)
	if gotPos.Epoch != 7 || gotPos.Next != 10 || len(gotPos.Markers) != 1 || gotPos.Markers[0] != (offsetfile.ChangelogMarker{Epoch: 7}) {
		t.Fatalf("position %+v, want %+v", gotPos, pos)
	}
	commit(6, 7, true, map[string]string{"d": "4"})
	must(t, s.Sync(ctx))
	if got, _ := s.Outbox(k, 10); len(got) != 1 || got[0].Seq != 3 {
		t.Fatalf("after the outbox emptied, numbering goes on: %+v", got)
	}

	st, err := s.BeginState(k)
	must(t, err)
	must(t, st.Put([]byte("z"), []byte("9")))
	restored := offsetfile.ChangelogPosition{Epoch: 20, Start: 30, Next: 21, Acked: -1}
	st.Restored(restored)
	must(t, st.Commit(ctx, 30, 2, "m"))
	must(t, s.Sync(ctx))
	if got, _ := s.Outbox(k, 10); len(got) != 0 {
		t.Fatalf("a restore empties the outbox: %+v", got)
	}
	if p, _ := s.ChangelogPosition(k); p.Epoch != 20 || p.Start != 30 || p.Next != 21 {
		t.Fatalf("restored position %+v", p)
	}
	if rec, _ := s.Synced(k); rec.Watermark != 30 {
		t.Fatalf("watermark %d, want 30", rec.Watermark)
	}
	if m := stateOf(t, s, k); m["z"] != "9" || m["b"] != "2" {
		t.Fatalf("state %v", m)
	}
}

// Check decodes every outbox entry and position: a damaged one is an
// error naming the partition, and the file is refused.
func TestCheckOutbox(t *testing.T) {
	path, _ := fileWithOneLoggedPut(t)
	rep, err := offsetfile.Check(path, nil)
	must(t, err)
	for _, f := range rep.Findings {
		t.Errorf("a sound outbox: %s", f)
	}
	writeBolt(t, path, nil, func(tx *bolt.Tx) error {
		b := outboxOf(tx)
		return b.Put([]byte{0, 0, 0, 0, 0, 0, 0, 0}, []byte{9})
	})
	rep, err = offsetfile.Check(path, nil)
	must(t, err)
	if len(rep.Findings) != 1 || rep.Findings[0].Severity != offsetfile.SeverityError || !strings.Contains(rep.Findings[0].Message, "outbox") {
		t.Fatalf("a damaged outbox entry: findings %v", rep.Findings)
	}
	if _, err := offsetfile.Open(path, nil); !errors.Is(err, offsetfile.ErrDamaged) {
		t.Fatalf("Open of a file with a damaged outbox entry: %v, want ErrDamaged", err)
	}
}

// A file written before outbox records held whole runs holds one entry per
// record: it still reads, and its entries are acknowledged as before.
func TestOutboxOfOneEntryPerRecord(t *testing.T) {
	path, k := fileWithOneLoggedPut(t)
	// The old format: version 0, the source offset, a delete flag, the
	// key's length and the key, then the value.
	entry := func(offset byte, del byte, key, value string) []byte {
		v := []byte{0, 0, 0, 0, 0, 0, 0, 0, offset, del, byte(len(key))}
		return append(append(v, key...), value...)
	}
	writeBolt(t, path, nil, func(tx *bolt.Tx) error {
		b := outboxOf(tx)
		for seq, v := range [][]byte{entry(0, 0, "a", "1"), entry(1, 0, "b", "22"), entry(2, 1, "a", "")} {
			if err := b.Put([]byte{0, 0, 0, 0, 0, 0, 0, byte(seq)}, v); err != nil {
				return err
			}
		}
		return b.Put([]byte("n"), []byte{0, 0, 0, 0, 0, 0, 0, 3})
	})
	rep, err := offsetfile.Check(path, nil)
	must(t, err)
	for _, f := range rep.Findings {
		t.Errorf("an outbox of the old format: %s", f)
	}
	s := mustOpen(t, path, nil)
	defer s.Close()
	got, err := s.Outbox(k, 10)
	must(t, err)
	if len(got) != 3 || string(got[1].Key) != "b" || string(got[1].Value) != "22" || got[1].Offset != 1 || got[1].Seq != 1 || !got[2].Delete {
		t.Fatalf("old outbox read as %+v", got)
	}
	must(t, s.AckOutbox(k, 1, offsetfile.NoChangelogPosition()))
	if got, err := s.Outbox(k, 10); err != nil || len(got) != 1 || got[0].Seq != 2 {
		t.Fatalf("after acknowledging two old entries: %+v %v", got, err)
	}
}

// fileWithOneLoggedPut is a closed file whose partition g/t/0 holds one
// logged Put, its change in the outbox.
func fileWithOneLoggedPut(t *testing.T) (string, offsetfile.Key) {
	t.Helper()
	path := tempPath(t)
	s := mustOpen(t, path, nil)
	k := offsetfile.Key{Group: "g", Topic: "t", Partition: 0}
	st, err := s.BeginState(k)
	must(t, err)
	must(t, st.Put([]byte("a"), []byte("1")))
	st.LogChanges(0)
	must(t, st.Commit(context.Background(), 1, 1, "m"))
	must(t, s.Close())
	return path, k
}

// outboxOf is the outbox bucket of fileWithOneLoggedPut's partition.
func outboxOf(tx *bolt.Tx) *bolt.Bucket {
	return tx.Bucket([]byte("changelog")).Bucket([]byte("g")).Bucket([]byte("t")).Bucket([]byte{0, 0, 0, 0})
}
