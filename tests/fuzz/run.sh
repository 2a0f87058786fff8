#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer through libfuzzer-sys) of the parsers: the JSON-RPC line
# reader and classifier, tool-argument validation, the Connect envelope decoder, the supervisor
# answer parser, and log pages (paging, masking, base64). Target bodies: tests/fuzz/targets.rs.
#
#   tests/fuzz/run.sh [TARGET...]            build, then fuzz each target (all by default)
#   FUZZ_SECONDS=10    seconds per target (the CI default); longer runs, for example one hour each:
#                      FUZZ_SECONDS=3600 tests/fuzz/run.sh
#                      (0 only replays the corpus, as `cargo test` also does)
#   FUZZ_SAVE=1        merge the inputs that add coverage back into fixtures/fuzz/<target>/
#                      (libFuzzer -merge=1); without it the committed corpus is never modified
#   FUZZ_ARTIFACTS=dir where crash inputs and logs go (default tests/fuzz/artifacts/<target>/,
#                      git-ignored): crash-*, timeout-*, oom-* and fuzz.log per target
#   FUZZ_RSS_MB=1024   memory limit per target; FUZZ_ARGS: extra libFuzzer flags
#
# Stable Rust is enough: the flags below are the ones cargo-fuzz passes, minus -Zsanitizer
# (Rust panics, overflow checks and debug assertions are what the targets detect). The crate has
# cargo-fuzz's layout, so with nightly `cargo fuzz run TARGET --fuzz-dir tests/fuzz
# fixtures/fuzz/TARGET` is the other way in (adds AddressSanitizer; untested here).
#
# A crash: reproduce with `tests/fuzz/target/<host>/release/TARGET <crash file>`, fix it, and
# commit the input as fixtures/fuzz/regressions/TARGET/<name>; `cargo test` replays every file
# there (tests/it/fuzz_corpus.rs). Exit status: 0 when no target crashed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
seconds="${FUZZ_SECONDS:-10}"
artifacts="${FUZZ_ARTIFACTS:-$here/artifacts}"
rss_mb="${FUZZ_RSS_MB:-1024}"
all=(jsonrpc_line tool_args connect_envelope supervisor_state log_page)
targets=("${@:-${all[@]}}")

# Input size caps: large enough for every branch (4 KiB paths, 1 KiB envelopes), small enough
# to stay fast.
max_len() {
    case "$1" in
        tool_args) echo 9000 ;;
        supervisor_state | log_page) echo 8192 ;;
        *) echo 4096 ;;
    esac
}

host="$(rustc -vV | sed -n 's/^host: //p')"
# --target keeps these flags off build scripts and proc macros (serde_derive), as cargo-fuzz does.
unset CARGO_ENCODED_RUSTFLAGS
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
echo "fuzz: building ${targets[*]}" >&2
start=$(date +%s)
(cd "$here" && cargo build --release --target "$host" $(printf -- '--bin %s ' "${targets[@]}"))
echo "fuzz: built in $(($(date +%s) - start)) s" >&2
bin="$here/target/$host/release"

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=0
summary=()
for t in "${targets[@]}"; do
    seeds="$root/fixtures/fuzz/$t"
    [ -d "$seeds" ] || { echo "fuzz: no seed corpus $seeds" >&2; exit 2; }
    out="$artifacts/$t"
    mkdir -p "$out" "$scratch/$t"
    cp "$seeds"/* "$scratch/$t/"
    extra=()
    [ -d "$root/fixtures/fuzz/regressions/$t" ] && extra+=("$root/fixtures/fuzz/regressions/$t")
    log="$out/fuzz.log"
    echo "fuzz: $t for ${seconds} s" >&2
    status=0
    if [ "$seconds" -gt 0 ]; then budget=(-max_total_time="$seconds"); else budget=(-runs=0); fi
    # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
    "$bin/$t" "${budget[@]}" -print_final_stats=1 -timeout=10 -rss_limit_mb="$rss_mb" \
        -max_len="$(max_len "$t")" -artifact_prefix="$out/" ${FUZZ_ARGS:-} \
        "$scratch/$t" "${extra[@]}" >"$log" 2>&1 || status=$?
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    crashes="$(grep -c '^artifact_prefix=.*Test unit written to' "$log" || true)"
    if [ "$status" -ne 0 ] || [ "$crashes" -ne 0 ]; then
        failed=1
        [ "$crashes" -ne 0 ] || crashes=1
        echo "fuzz: $t FAILED (exit $status); last lines of $log:" >&2
        tail -n 40 "$log" >&2
    fi
    summary+=("$(printf '%-18s %12s executions  %d crashes' "$t" "${execs:-?}" "$crashes")")
    if [ "${FUZZ_SAVE:-0}" = 1 ]; then
        "$bin/$t" -merge=1 -max_len="$(max_len "$t")" -rss_limit_mb="$rss_mb" "$seeds" "$scratch/$t" >>"$log" 2>&1
        echo "fuzz: $t corpus now $(ls "$seeds" | wc -l) files" >&2
    fi
done
printf '%s\n' "${summary[@]}"
if [ "$failed" -ne 0 ]; then
    echo "fuzz: crash inputs are in $artifacts/<target>/ (see the header of tests/fuzz/run.sh)" >&2
fi
exit "$failed"
