package bench

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// benchClockTick is the unit of the CPU times in /proc (USER_HZ), which is
// 100 on every Linux architecture Go supports.
const benchClockTick = 10 * time.Millisecond

// benchCPU is a reading of CPU time: the machine's idle time over all
// cores (from /proc/stat) and when it was read, the server's (the
// postmaster and its processes, when the bench started it), this
// process's and its waited-for children's, and the wall clock beside them.
//
// The machine's busy time between two readings is the cores' time minus
// their idle, iowait and steal time, not the sum of /proc/stat's busy
// counters: with tick-based CPU accounting and the tick stopped on idle
// cores (NO_HZ_IDLE, this machine's kernel), those counters charge a whole
// tick to whatever runs when it fires and miss bursts that begin and end
// between two ticks, as a worker that wakes every millisecond does (one
// such run of 11.4 s left 4.4 s of the two cores' 22.8 s in no counter),
// while idle and iowait time are kept exactly.
type benchCPU struct {
	machineIdle time.Duration // idle + iowait + steal, over all cores
	cpus        int           // the cores /proc/stat lists
	statAt      time.Time     // when /proc/stat was read
	server      time.Duration
	self        time.Duration
	at          time.Time
}

// readBenchCPU reads the CPU times; serverPID is the postmaster's process
// id, 0 when unknown. Fields it cannot read (not Linux) stay zero.
func readBenchCPU(serverPID int) benchCPU {
	c := benchCPU{at: time.Now()}
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if syscall.Getrusage(who, &ru) == nil {
			c.self += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		}
	}
	if serverPID > 0 {
		c.server = benchTreeCPU(serverPID)
	}
	b, err := os.ReadFile("/proc/stat")
	c.statAt = time.Now()
	if err != nil {
		return c
	}
	lines := strings.Split(string(b), "\n")
	f := strings.Fields(lines[0])
	if len(f) < 9 || f[0] != "cpu" {
		return c
	}
	for _, i := range []int{4, 5, 8} { // idle, iowait, steal
		v, _ := strconv.ParseInt(f[i], 10, 64)
		c.machineIdle += time.Duration(v) * benchClockTick
	}
	for _, l := range lines[1:] {
		if name, _, _ := strings.Cut(l, " "); strings.HasPrefix(name, "cpu") && len(name) > 3 {
			c.cpus++
		}
	}
	return c
}

// machine returns the machine's busy time between start and c, over all
// cores, and the cores' time; zeros when /proc/stat was not read.
func (c benchCPU) machine(start benchCPU) (busy, all time.Duration) {
	if c.cpus == 0 || start.cpus == 0 || c.statAt.IsZero() || start.statAt.IsZero() {
		return 0, 0
	}
	all = time.Duration(c.cpus) * c.statAt.Sub(start.statAt)
	return max(0, all-(c.machineIdle-start.machineIdle)), all
}

// benchCPUDelta is the CPU spent between two readings.
type benchCPUDelta struct {
	wall    time.Duration
	own     time.Duration // this process, its children and the server
	self    time.Duration // this process and its children
	busy    float64       // fraction of the machine's cores busy
	foreign float64       // fraction of the machine's cores busy with other processes
}

// since returns the CPU spent from start to c.
func (c benchCPU) since(start benchCPU) benchCPUDelta {
	d := benchCPUDelta{wall: c.at.Sub(start.at), self: c.self - start.self}
	d.own = d.self + c.server - start.server
	if busy, all := c.machine(start); all > 0 {
		d.busy = float64(busy) / float64(all)
		d.foreign = max(0, float64(busy-d.own)/float64(all))
	}
	return d
}

// benchTreeCPU returns the CPU time of process pid and of its children,
// live (from their /proc/<pid>/stat) and exited (the parent's cutime and
// cstime): for the postmaster, the whole server's.
func benchTreeCPU(pid int) time.Duration {
	total := time.Duration(0)
	if st, err := benchProcStat(pid); err == nil {
		total += st.cpu + st.childrenCPU
	}
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		child, err := strconv.Atoi(d.Name())
		if err != nil || child == pid {
			continue
		}
		if st, err := benchProcStat(child); err == nil && st.ppid == pid {
			total += st.cpu
		}
	}
	return total
}

// benchStat is what the bench reads from /proc/<pid>/stat.
type benchStat struct {
	ppid        int
	cpu         time.Duration // utime + stime
	childrenCPU time.Duration // cutime + cstime of waited-for children
}

// benchProcStat reads /proc/<pid>/stat.
func benchProcStat(pid int) (benchStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return benchStat{}, err
	}
	// The command name, in parentheses, may contain spaces: fields are
	// counted after its closing parenthesis. f[0] is field 3 (state).
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	var f []string
	if i >= 0 {
		f = strings.Fields(s[i+1:])
	}
	if len(f) < 15 {
		return benchStat{}, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	field := func(n int) int64 { v, _ := strconv.ParseInt(f[n-3], 10, 64); return v }
	return benchStat{
		ppid:        int(field(4)),
		cpu:         time.Duration(field(14)+field(15)) * benchClockTick,
		childrenCPU: time.Duration(field(16)+field(17)) * benchClockTick,
	}, nil
}

// benchProcCPU returns the user plus system CPU time of process pid.
func benchProcCPU(pid int) (time.Duration, error) {
	st, err := benchProcStat(pid)
	return st.cpu, err
}

// benchProcStatusKB returns a "kB" field of /proc/<pid>/status, such as
// VmHWM (peak resident set) or VmRSS.
func benchProcStatusKB(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == field {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// benchMemTotalMiB returns the machine's memory from /proc/meminfo, or 0.
func benchMemTotalMiB() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb / 1024
		}
	}
	return 0
}
