package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// usage is a reading of the machine's busy CPU time and of this process's
// own (its children's included, once they were waited for), to tell how
// busy the machine was with other work during the run.
type usage struct {
	at   time.Time
	busy time.Duration // every CPU, every process (/proc/stat), -1 when unknown
	ours time.Duration // this process and its waited-for children
	self time.Duration // this process alone: with kfake, the broker's CPU
	// kafka is the CPU of the single-node Kafka that scripts/kafka-local
	// started (TIDEMARK_KAFKA_DIR's broker.pid), -1 when there is none.
	kafka   time.Duration
	loadavg string
	// steal is the CPU time the hypervisor gave to others while the
	// machine's CPUs had work (/proc/stat), memStall the time every task
	// waited at once for memory (/proc/pressure/memory "full"): neither is
	// counted in a process's CPU, and both slow a run at the same CPU per
	// message. -1 when unknown.
	steal, memStall time.Duration
}

func readUsage() usage {
	u := usage{at: time.Now(), busy: -1, steal: -1, memStall: readMemStall(), kafka: localKafkaCPU()}
	var self, kids syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &self) == nil && syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids) == nil {
		u.self = time.Duration(self.Utime.Nano() + self.Stime.Nano())
		u.ours = u.self + time.Duration(kids.Utime.Nano()+kids.Stime.Nano())
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		f := strings.Fields(string(b))
		if len(f) >= 3 {
			u.loadavg = strings.Join(f[:3], " ")
		}
	}
	f, err := os.Open("/proc/stat")
	if err != nil {
		return u
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if sc.Scan() {
		// cpu user nice system idle iowait irq softirq steal guest guest_nice
		fields := strings.Fields(sc.Text())
		if len(fields) >= 9 && fields[0] == "cpu" {
			var busy int64
			for i, v := range fields[1:9] {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return u
				}
				if i != 3 && i != 4 { // idle, iowait
					busy += n
				}
			}
			// USER_HZ is 100 on every Linux Go supports.
			u.busy = time.Duration(busy) * 10 * time.Millisecond
			if n, err := strconv.ParseInt(fields[8], 10, 64); err == nil {
				u.steal = time.Duration(n) * 10 * time.Millisecond
			}
		}
	}
	return u
}

// localKafkaCPU reads the CPU time of the broker scripts/kafka-local runs
// with one node (it exports TIDEMARK_KAFKA_DIR, where broker.pid names its
// JVM): -1 when there is none, or it cannot be read.
func localKafkaCPU() time.Duration {
	dir := os.Getenv("TIDEMARK_KAFKA_DIR")
	if n := os.Getenv("KAFKA_NODES"); dir == "" || (n != "" && n != "1") {
		return -1
	}
	pid, err := os.ReadFile(dir + "/broker.pid")
	if err != nil {
		return -1
	}
	b, err := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/stat")
	if err != nil {
		return -1
	}
	// The fields after the command's closing parenthesis: state is the
	// first, utime and stime the 12th and 13th.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return -1
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(ut+st) * 10 * time.Millisecond // USER_HZ, as above
}

// brokerCPU is the broker's CPU time between u0 and u1: this process's
// with kfake, the local Kafka's (localKafkaCPU) otherwise; -1 when
// unknown.
func brokerCPU(fake bool, u0, u1 usage) time.Duration {
	switch {
	case fake:
		return u1.self - u0.self
	case u0.kafka >= 0 && u1.kafka >= 0:
		return u1.kafka - u0.kafka
	}
	return -1
}

// readMemStall reads the total time all tasks stalled on memory at once
// (PSI "full"), -1 when the kernel does not report it.
func readMemStall() time.Duration {
	b, err := os.ReadFile("/proc/pressure/memory")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "full ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "total="); ok {
				if us, err := strconv.ParseInt(v, 10, 64); err == nil {
					return time.Duration(us) * time.Microsecond
				}
			}
		}
	}
	return -1
}

// disturbed says what slowed the machine between u0 and u1 without showing
// in any process's CPU: the hypervisor's steal and stalls on memory; "" when
// neither is known.
func disturbed(u0, u1 usage) string {
	var parts []string
	if u0.steal >= 0 && u1.steal >= 0 {
		parts = append(parts, fmt.Sprintf("steal %s", (u1.steal-u0.steal).Round(10*time.Millisecond)))
	}
	if u0.memStall >= 0 && u1.memStall >= 0 {
		parts = append(parts, fmt.Sprintf("memory stalls %s", (u1.memStall-u0.memStall).Round(time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}

// others is the average number of CPUs that processes other than this one
// and its children kept busy between u0 and u1, or -1 when unknown.
func others(u0, u1 usage) float64 {
	if u0.busy < 0 || u1.busy < 0 {
		return -1
	}
	wall := u1.at.Sub(u0.at)
	if wall <= 0 {
		return -1
	}
	return max(0, float64((u1.busy-u0.busy)-(u1.ours-u0.ours))/float64(wall))
}

// machine describes the CPU, memory and kernel.
func machine() string {
	model := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "model name") {
				if i := strings.Index(line, ":"); i >= 0 {
					model = strings.TrimSpace(line[i+1:])
				}
				break
			}
		}
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
					mem = fmt.Sprintf(", %.0f GiB memory", float64(kb)/(1<<20))
				}
			}
		}
	}
	kernel := ""
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		kernel = ", Linux " + strings.TrimSpace(string(b))
	}
	return fmt.Sprintf("%d CPUs (%s)%s%s, %s/%s", runtime.NumCPU(), model, mem, kernel, runtime.GOOS, runtime.GOARCH)
}

// versions lists Go and the modules compared, as built into this binary.
func versions() string {
	want := []string{
		"github.com/segmentio/kafka-go",
		"github.com/IBM/sarama",
		"github.com/twmb/franz-go",
		"github.com/twmb/franz-go/pkg/kfake",
		"go.etcd.io/bbolt",
	}
	out := []string{runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return out[0]
	}
	for _, w := range want {
		for _, d := range bi.Deps {
			if d.Path == w {
				v := d.Version
				if d.Replace != nil {
					v = d.Replace.Version
				}
				out = append(out, d.Path+" "+v)
			}
		}
	}
	out = append(out, "tidemark: this checkout (replace => ../)"+gitDescribe())
	return strings.Join(out, ", ")
}

// gitDescribe names the commit of the checkout, if git can tell.
func gitDescribe() string {
	b, err := exec.Command("git", "log", "-1", "--format=%h %s").Output()
	if err != nil {
		return ""
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	dirty := ""
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		dirty = ", with uncommitted changes"
	}
	return " at " + s + dirty
}

// javaVersion is the first line of `java -version`, for the real-broker
// section.
func javaVersion() string {
	b, err := exec.Command("java", "-version").CombinedOutput()
	if err != nil {
		return "unknown"
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strings.TrimSpace(line)
}
