package testsupport

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tidemark/tidemark/internal/offsetfile"
)

// Child processes: a test runs its own test binary again, with EnvChild
// naming what the child does, to have a real process to SIGKILL or to hold
// a lock. The test binary's TestMain must give the child its turn first:
//
//	func TestMain(m *testing.M) {
//		if code, ok := testsupport.ChildMain(); ok {
//			os.Exit(code)
//		}
//		goleak.VerifyTestMain(m)
//	}
//
// (frameworktest.ChildMain in a package whose tests start consumer
// children.)
const (
	// EnvChild names the child's kind: "lock" (HoldLock), or "consume"
	// (frameworktest.StartChild).
	EnvChild = "TIDEMARK_CHILD"
	// envLockFile is the offset file a "lock" child holds.
	envLockFile = "TIDEMARK_CHILD_LOCK_FILE"
)

// ChildKind is the kind of child this process is asked to be; "" in the
// test process itself.
func ChildKind() string { return os.Getenv(EnvChild) }

// ChildMain runs the child this process is asked to be and returns its
// exit status and true; it returns false in the test process itself. It
// knows the "lock" child; any other kind exits 2.
func ChildMain() (code int, ok bool) {
	switch kind := ChildKind(); kind {
	case "":
		return 0, false
	case "lock":
		return childLock(os.Getenv(envLockFile)), true
	default:
		fmt.Fprintf(os.Stderr, "this test binary runs no %s=%q child\n", EnvChild, kind)
		return 2, true
	}
}

// childLock opens an offset file, says "locked" on its standard output,
// and holds the file until its standard input closes.
func childLock(path string) int {
	s, err := offsetfile.Open(path, nil)
	if err != nil {
		fmt.Printf("error: %v\n", err)
		return 2
	}
	fmt.Println("locked")
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// childCommand is this test binary, running no test, as a child of kind
// with env added.
func childCommand(t testing.TB, kind string, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(append(os.Environ(), EnvChild+"="+kind), env...)
	return cmd
}

// HoldLock opens the offset file at path in a child process, which holds
// its lock until the test ends, and returns the child's pid. The child's
// failure to open it, or to close it cleanly, fails the test.
func HoldLock(t testing.TB, path string) int {
	t.Helper()
	cmd := childCommand(t, "lock", envLockFile+"="+path)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("the child holding %s: %v", path, err)
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "locked\n" {
		t.Fatalf("the child did not lock %s: it said %q (%v)", path, line, err)
	}
	return cmd.Process.Pid
}

// Child is a child process of the test (see StartChild).
type Child struct {
	cmd    *exec.Cmd
	stderr syncBuffer
	exited chan struct{}
	err    error // Wait's, once exited is closed
}

// StartChild starts this test binary again as a child of kind, with env
// added to its environment. It is killed when the test ends if it still
// runs, and the tail of its standard error is logged if the test failed.
func StartChild(t testing.TB, kind string, env ...string) *Child {
	t.Helper()
	c := &Child{cmd: childCommand(t, kind, env...), exited: make(chan struct{})}
	c.cmd.Stderr = &c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		_ = c.cmd.Process.Kill()
		<-c.exited
		if t.Failed() {
			if s := c.Stderr(); s != "" {
				t.Logf("child %d's stderr:\n%s", c.Pid(), Tail(s, 3000))
			}
		}
	})
	return c
}

// Pid is the child's process id.
func (c *Child) Pid() int { return c.cmd.Process.Pid }

// Exited is closed once the child has exited.
func (c *Child) Exited() <-chan struct{} { return c.exited }

// ExitCode is the child's exit status once it has exited; -1 if a signal
// ended it.
func (c *Child) ExitCode() int {
	<-c.exited
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		return ee.ExitCode()
	}
	if c.err != nil {
		return -1
	}
	return 0
}

// Stderr is what the child wrote to its standard error so far.
func (c *Child) Stderr() string { return c.stderr.String() }

// Kill sends the child SIGKILL and waits for it to exit.
func (c *Child) Kill(t testing.TB) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL to child %d: %v", c.Pid(), err)
	}
	<-c.exited
}

// Stop sends the child SIGTERM, waits up to a minute for it to exit and
// returns its exit error: nil for a graceful stop.
func (c *Child) Stop(t testing.TB) error {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM to child %d: %v", c.Pid(), err)
	}
	select {
	case <-c.exited:
	case <-time.After(time.Minute):
		t.Fatalf("child %d still running a minute after SIGTERM:\n%s", c.Pid(), Tail(c.Stderr(), 3000))
	}
	if c.err != nil {
		return fmt.Errorf("child %d: %w; its stderr ends:\n%s", c.Pid(), c.err, Tail(c.Stderr(), 3000))
	}
	return nil
}

// syncBuffer is a bytes.Buffer the child's output may be written to while
// the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Tail is the last n bytes of s, for logging a long output.
func Tail(s string, n int) string {
	if len(s) > n {
		return "..." + strings.TrimLeft(s[len(s)-n:], "\n")
	}
	return s
}
