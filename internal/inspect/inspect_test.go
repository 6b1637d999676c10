package inspect

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// The side file round-trips, mode 0600; a missing one is ErrNoEndpoint and
// one of another version, network or kind is refused with its path named.
func TestSideFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "offsets.db")
	if _, err := ReadEndpoint(file); !errors.Is(err, ErrNoEndpoint) {
		t.Fatalf("no side file: %v, want ErrNoEndpoint", err)
	}
	ep := Endpoint{Version: Version, Pid: 7, Network: "unix", Address: file + SocketSuffix, Token: "t", OffsetFile: file}
	if err := WriteSideFile(file+SideFileSuffix, &ep); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(file + SideFileSuffix); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("side file: %v, %v; want mode 0600", fi, err)
	}
	got, err := ReadEndpoint(file)
	if err != nil || *got != ep {
		t.Fatalf("read %+v, %v; want %+v", got, err, ep)
	}
	for what, body := range map[string]string{
		"version 2":                          `{"version":2,"network":"unix"}`,
		`unknown network`:                    `{"version":1,"network":"udp"}`,
		"offsets.db.inspect: unexpected end": `{`,
	} {
		if err := os.WriteFile(file+SideFileSuffix, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadEndpoint(file); err == nil || !strings.Contains(err.Error(), what) {
			t.Errorf("side file %s: %v, want an error naming %q", body, err, what)
		}
	}
	if err := os.Remove(file + SideFileSuffix); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(file+SideFileSuffix, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadEndpoint(file); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory as the side file: %v", err)
	}
}

// Only skips and dead letters are recorded, under their past-tense names.
func TestActionNames(t *testing.T) {
	for a, want := range map[offsetfile.FailureAction]string{offsetfile.FailureSkip: "skipped", offsetfile.FailureDeadLetter: "dead-lettered"} {
		got, err := ActionName(a)
		if err != nil || got != want {
			t.Errorf("ActionName(%v) = %q, %v; want %q", a, got, err, want)
		}
		if back, err := ParseAction(want); err != nil || back != a {
			t.Errorf("ParseAction(%q) = %v, %v; want %v", want, back, err, a)
		}
	}
	for _, a := range []offsetfile.FailureAction{offsetfile.FailureRetry, offsetfile.FailureStop, 9} {
		if s, err := ActionName(a); err == nil {
			t.Errorf("ActionName(%v) = %q, want an error", a, s)
		}
	}
	for _, s := range []string{"skip", "retry", ""} {
		if a, err := ParseAction(s); err == nil {
			t.Errorf("ParseAction(%q) = %v, want an error", s, a)
		}
	}
}

// Without framework, no status page is registered: StatusPage says so
// instead of serving nothing.
func TestStatusPageUnregistered(t *testing.T) {
	type stats struct{}
	src := func(context.Context, bool) (*Snapshot[stats], error) { return &Snapshot[stats]{}, nil }
	if h, err := StatusPage[stats](src); err == nil || h != nil {
		t.Errorf("StatusPage without a registered page: %v, %v; want an error", h, err)
	}
	if h, err := StatusPage[stats](nil); err == nil || h != nil {
		t.Errorf("StatusPage(nil): %v, %v; want an error", h, err)
	}
}
