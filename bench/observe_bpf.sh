#!/usr/bin/env bash
# Issue 47, "where to observe": the cost of observing by ptrace stops
# (highwater today) against BPF programs that stream events without
# stopping the command, on the same commands, interleaved.
#   bench/observe_bpf.sh [OBSERVE_BENCH=target/release/examples/observe_bench] [N_CP=2000] [N_SHIM=50] [ROUNDS=3]
# Needs root and bpftrace. The BPF side is bpftrace attached to the
# syscall-entry tracepoints of the calls highwater's filter stops for
# (open*, stat*, access*, readlink*, getdents*, exec*, chdir), each event
# copying its path and pid into the perf buffer, filtered to a cgroup that
# holds only the measured commands: an upper bound of what a BPF observer's
# ring buffer costs per event (a real one would also resolve paths in the
# kernel, in fentry/LSM programs this bpftrace cannot attach here).
# Figures are CPU time (user + system) of the commands and the observer
# (the tracer thread; bpftrace's consumer), which a shared machine moves
# far less than wall time; the kernel's BPF time is charged to the
# commands.
set -euo pipefail
OB=$(realpath "${1:-target/release/examples/observe_bench}")
N_CP=${2:-2000}
N_SHIM=${3:-50}
ROUNDS=${4:-3}
SHIM=${SHIM:-$(command -v python3)}
W=$(mktemp -d)
CG=/sys/fs/cgroup/unified/hw-observe-bpf
cleanup() {
  [ -n "${BT:-}" ] && kill "$BT" 2>/dev/null || true
  echo $$ > /sys/fs/cgroup/unified/cgroup.procs 2>/dev/null || true
  rmdir "$CG" 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
mkdir -p "$CG"
echo $$ > "$CG/cgroup.procs"
echo data > "$W/a"
probes=""
for c in openat:filename open:filename newfstatat:filename statx:filename access:filename \
         faccessat:filename faccessat2:filename readlink:path readlinkat:pathname \
         execve:filename chdir:filename; do
  probes+="tracepoint:syscalls:sys_enter_${c%%:*} /cgroup == cgroupid(\"$CG\")/ { printf(\"%d %s\\n\", pid, str(args->${c#*:})); }
"
done
probes+="tracepoint:syscalls:sys_enter_getdents64 /cgroup == cgroupid(\"$CG\")/ { printf(\"%d dir %d\\n\", pid, args->fd); }
"
# CPU time (user + system, the commands' and the observer's), in ms: on a
# shared machine wall time moves by 2x between runs, CPU time much less.
cpu_ms() { # mode n dir program args...
  local f="$W/time.txt"
  /usr/bin/time -f "%U %S" -o "$f" "$OB" "$@" > /dev/null
  awk '{ printf "%d", ($1 + $2) * 1000 }' "$f"
}
proc_cpu_ms() { # pid -> utime + stime of a running process, in ms
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%d", ($14 + $15) * 1000 / hz }' "/proc/$1/stat"
}
run_set() { # n program args -> prints "plain ptrace bpf" ms
  local n=$1; shift
  local plain ptrace bpf
  plain=$(cpu_ms plain "$n" "$W" "$@")
  ptrace=$(cpu_ms observed "$n" "$W" "$@")
  bpftrace -e "$probes" -o "$W/events.txt" > "$W/bpftrace.log" 2>&1 &
  BT=$!
  # Attached once the first event of a probe command lands.
  for _ in $(seq 100); do
    true; ls "$W" > /dev/null
    [ -s "$W/events.txt" ] && break
    sleep 0.1
  done
  sleep 1
  local before after cmds
  before=$(proc_cpu_ms "$BT")
  cmds=$(cpu_ms plain "$n" "$W" "$@")
  sleep 1  # the consumer drains what is left
  after=$(proc_cpu_ms "$BT")
  bpf=$(( cmds + after - before ))
  kill "$BT"; wait "$BT" 2>/dev/null || true; BT=
  echo "$plain $ptrace $bpf $(wc -l < "$W/events.txt")"
  rm -f "$W/events.txt"
}
for round in $(seq "$ROUNDS"); do
  read -r p t b e < <(run_set "$N_CP" cp a "b{i}")
  echo "round $round: $N_CP cp, CPU: plain $p ms, ptrace $t ms ($(python3 -c "print(f'{$t/$p:.2f}')")x), bpf $b ms ($(python3 -c "print(f'{$b/$p:.2f}')")x), $e events"
  read -r p t b e < <(run_set "$N_SHIM" "$SHIM" -c pass)
  echo "round $round: $N_SHIM $SHIM -c pass, CPU: plain $p ms, ptrace $t ms ($(python3 -c "print(f'{$t/$p:.2f}')")x), bpf $b ms ($(python3 -c "print(f'{$b/$p:.2f}')")x), $e events"
done
