package offsetfile_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// stateOf reads k's whole state as a map, through ViewState.
func stateOf(t *testing.T, s *offsetfile.Store, k offsetfile.Key) map[string]string {
	t.Helper()
	out := map[string]string{}
	if err := s.ViewState(k, func(st *offsetfile.StateTx) error {
		return st.ForEach(func(key, value []byte) error {
			out[string(key)] = string(value)
			return nil
		})
	}); err != nil {
		t.Fatalf("ViewState: %v", err)
	}
	return out
}

// A run sees the file's state with its own changes over it; Commit writes
// the changes and the watermark together, Discard drops them; the next
// run, and the file reopened, see what was committed.
func TestStateRuns(t *testing.T) {
	path := tempPath(t)
	s, err := offsetfile.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	k := offsetfile.Key{Group: "g", Topic: "t", Partition: 3}
	other := offsetfile.Key{Group: "g", Topic: "t", Partition: 4}

	st, err := s.BeginState(k)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := st.Get([]byte("a")); v != nil || err != nil {
		t.Fatalf("Get of an absent key = %q, %v", v, err)
	}
	for _, kv := range [][2]string{{"b", "2"}, {"a", "1"}, {"c", "3"}, {"e", ""}} {
		if err := st.Put([]byte(kv[0]), []byte(kv[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Delete([]byte("c")); err != nil {
		t.Fatal(err)
	}
	if v, _ := st.Get([]byte("e")); v == nil || len(v) != 0 {
		t.Fatalf("an empty value reads as %#v, want empty and not nil", v)
	}
	if err := st.Commit(ctx, 10, 1, "m"); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if rec, _ := s.Synced(k); rec.Watermark != 10 {
		t.Fatalf("after Commit the synced watermark is %d, want 10", rec.Watermark)
	}
	if err := st.Put([]byte("x"), nil); !errors.Is(err, offsetfile.ErrStateRunEnded) {
		t.Fatalf("Put after Commit = %v, want ErrStateRunEnded", err)
	}

	// The next run: the file's values with its changes over them, in
	// key order, deletions hidden.
	st, err = s.BeginState(k)
	if err != nil {
		t.Fatal(err)
	}
	must(t, st.Put([]byte("b"), []byte("22")))
	must(t, st.Put([]byte("d"), []byte("4")))
	must(t, st.Delete([]byte("a")))
	var walk []string
	must(t, st.ForEach(func(key, value []byte) error {
		walk = append(walk, string(key)+"="+string(value))
		return nil
	}))
	if got := strings.Join(walk, " "); got != "b=22 d=4 e=" {
		t.Fatalf("ForEach walked %q, want %q", got, "b=22 d=4 e=")
	}
	st.Discard()
	if got := stateOf(t, s, k); fmt.Sprint(got) != "map[a:1 b:2 e:]" {
		t.Fatalf("after a discarded run the state is %v", got)
	}
	if got := stateOf(t, s, other); len(got) != 0 {
		t.Fatalf("another partition's state: %v", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.ViewState(k, func(*offsetfile.StateTx) error { return nil }); !errors.Is(err, offsetfile.ErrClosed) {
		t.Fatalf("ViewState after Close = %v, want ErrClosed", err)
	}

	// Read-only, after a reopening: the state, and the check counts it.
	ro := mustOpen(t, path, &offsetfile.Options{ReadOnly: true})
	if got := stateOf(t, ro, k); fmt.Sprint(got) != "map[a:1 b:2 e:]" {
		t.Fatalf("reopened, the state is %v", got)
	}
	if err := ro.ViewState(k, func(st *offsetfile.StateTx) error { return st.Put([]byte("a"), nil) }); !errors.Is(err, offsetfile.ErrStateRunEnded) {
		t.Fatalf("Put in ViewState = %v, want ErrStateRunEnded", err)
	}
	if _, err := ro.BeginState(k); !errors.Is(err, offsetfile.ErrReadOnly) {
		t.Fatalf("BeginState on a read-only store = %v, want ErrReadOnly", err)
	}
	rep, err := offsetfile.Check(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.StateEntries != 3 || rep.Worst() != 0 {
		t.Fatalf("Check: %d state entries, findings %v; want 3 and none", rep.StateEntries, rep.Findings)
	}
}

// Bad keys and values are refused with an error naming the partition and
// the limit; nothing of the run is written.
func TestStateLimits(t *testing.T) {
	s := mustOpenStore(t, nil)
	k := offsetfile.Key{Group: "g", Topic: "orders", Partition: 7}
	st, err := s.BeginState(k)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Discard()
	for _, c := range []struct {
		name       string
		key, value []byte
		want       string
	}{
		{"nil key", nil, []byte("v"), "nil key"},
		{"empty key", []byte{}, []byte("v"), "empty key"},
		{"long key", bytes.Repeat([]byte("k"), offsetfile.MaxStateKey+1), nil, "MaxStateKey"},
		{"large value", []byte("k"), make([]byte, offsetfile.MaxStateValue+1), "MaxStateValue"},
	} {
		err := st.Put(c.key, c.value)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "orders") {
			t.Errorf("%s: Put = %v, want an error naming %s and the topic", c.name, err, c.want)
		}
	}
	if _, err := st.Get(nil); err == nil {
		t.Error("Get(nil) succeeded")
	}
	if err := st.Delete(nil); err == nil {
		t.Error("Delete(nil) succeeded")
	}
	if err := st.Put(bytes.Repeat([]byte("k"), offsetfile.MaxStateKey), make([]byte, offsetfile.MaxStateValue)); err != nil {
		t.Errorf("a key and a value at the limits: %v", err)
	}
}

// A run begun before FenceState (an earlier assignment's, still in its
// handler), or whose context ended, commits nothing.
func TestStateFence(t *testing.T) {
	s := mustOpenStore(t, nil)
	k := offsetfile.Key{Group: "g", Topic: "t", Partition: 0}
	old, err := s.BeginState(k)
	if err != nil {
		t.Fatal(err)
	}
	must(t, old.Put([]byte("a"), []byte("old")))
	s.FenceState(k)
	if err := old.Commit(context.Background(), 5, 1, "m"); !errors.Is(err, offsetfile.ErrStateRunEnded) {
		t.Fatalf("Commit of a fenced run = %v, want ErrStateRunEnded", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	st, err := s.BeginState(k)
	if err != nil {
		t.Fatal(err)
	}
	must(t, st.Put([]byte("a"), []byte("late")))
	if err := st.Commit(ctx, 5, 1, "m"); !errors.Is(err, offsetfile.ErrStateRunEnded) {
		t.Fatalf("Commit with its context ended = %v, want ErrStateRunEnded", err)
	}
	must(t, s.Sync(context.Background()))
	if got := stateOf(t, s, k); len(got) != 0 {
		t.Fatalf("state %v, want none", got)
	}
	if rec, _ := s.Synced(k); rec.Watermark != -1 {
		t.Fatalf("watermark %d, want none", rec.Watermark)
	}
}
