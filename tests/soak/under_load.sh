#!/usr/bin/env bash
# The soak (tests/soak/driver.rs) beside 30 CPU hogs and a memory-pressure hog, for the 30-s
# snippet timeouts seen under load: `tests/soak/under_load.sh [SECONDS]` (600 by default).
# The hogs are nice'd (other work on the machine keeps its share). Where a cgroup-v1 memory
# controller is writable (root), the soak and the memory hog share a memory cgroup of
# SOAK_CGROUP_MB (2048) MiB, in which the hog keeps HOG_MB (1600) MiB mapped and churned, so that
# everything else in it runs under reclaim (too large a hog makes the cgroup's OOM killer end the
# soak's own servers); elsewhere the hog takes HOG_MB MiB of the machine.
# The soak's own checks decide: exit status 0 and "errors":0 in its last line.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${1:-600}
hog_mb=${HOG_MB:-1600}
cg_mb=${SOAK_CGROUP_MB:-2048}
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -s TERM "$p" 2>/dev/null || true; done
    if [ -n "${cg:-}" ]; then
        # Out of the cgroup first: it can only be removed once empty.
        echo $$ >/sys/fs/cgroup/memory/cgroup.procs 2>/dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do rmdir "$cg" 2>/dev/null && break; sleep 0.5; done
    fi
}
trap cleanup EXIT
cargo build --quiet --release
cargo build --quiet --release --example soak
cg=
if [ -w /sys/fs/cgroup/memory ]; then
    cg=/sys/fs/cgroup/memory/sandbox-mcp-soak-$$
    mkdir "$cg"
    echo $((cg_mb << 20)) >"$cg/memory.limit_in_bytes"
    echo $$ >"$cg/cgroup.procs"
    echo "under_load: soak and memory hog in a ${cg_mb} MiB memory cgroup"
fi
for _ in $(seq 30); do
    nice -n 19 sh -c 'while :; do :; done' &
    pids+=($!)
done
# Keeps hog_mb MiB of anonymous memory mapped, touching its pages and unmapping and mapping it
# again in 64 MiB chunks (mmap_lock writers), forever; started again whenever the cgroup's OOM
# killer ends it, so that the pressure lasts the whole run.
hog='
import mmap, random, sys
size = int(sys.argv[1]) << 20; chunk = 64 << 20; maps = []
while True:
    while sum(len(m) for m in maps) < size:
        m = mmap.mmap(-1, chunk)
        for i in range(0, chunk, 4096): m[i] = 1
        maps.append(m)
    for _ in range(20000): random.choice(maps)[random.randrange(0, chunk, 4096)] = 2
    maps.pop(random.randrange(len(maps))).close()
'
(
    c=
    trap 'kill -s TERM "$c" 2>/dev/null; exit 0' TERM
    while :; do
        nice -n 10 python3 -c "$hog" "$hog_mb" 2>/dev/null &
        c=$!
        wait "$c" || true
        echo "under_load: the memory hog ended (OOM killer?); starting it again" >&2
    done
) &
pids+=($!)
pidns=
unshare -fp --mount-proc true >/dev/null 2>&1 && pidns="unshare -fp --mount-proc"
echo "under_load: $seconds s soak beside 30 CPU hogs and a ${hog_mb} MiB memory hog"
SOAK_SECONDS=$seconds $pidns "$root/target/release/examples/soak"
