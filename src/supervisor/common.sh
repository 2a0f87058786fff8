# common.sh: helpers shared by every supervisor snippet (POSIX sh: dash, bash, busybox ash).
# Reads /proc with the builtin `read` (no fork); signals only through the builtin `kill`.
# The server sends each snippet as a preamble of constants, this file, the snippet, and
# inspect.sh (the helpers that read tasks) where the snippet's file has its `# @inspect` line, or
# else before it: a shell parses its program as it runs it, so the start path does not parse
# what it does not use before its answer. The snippets' arguments, the state file's keys and the
# answers' keys are described in one place: the module doc of src/supervisor/mod.rs.
# Helpers return their results in global variables (ST_*, S_*, E_*, NOW, CS, BOOT, ROOT) that
# only some snippets read, hence the SC2034 (unused variable) exceptions below.

# proc_stat PID: sets ST_STATE ST_PPID ST_PGID ST_SID ST_TTY ST_START (fields 3 to 7 and 22 of
# /proc/PID/stat).
# shellcheck disable=SC2034 # ST_PPID is read by supervise.sh only, ST_SID and ST_TTY by resize.sh
proc_stat() {
    _s=''
    read -r _s 2>/dev/null <"/proc/$1/stat" || return 1
    _s=${_s##*) }
    set -f
    # Split into fields on purpose (globbing is off).
    # shellcheck disable=SC2086
    set -- $_s
    set +f
    ST_STATE=$1 ST_PPID=$2 ST_PGID=$3 ST_SID=$4 ST_TTY=$5 ST_START=${20}
    [ -n "$ST_START" ]
}

# alive PID START: that exact process exists and is not a zombie.
alive() {
    case $1 in '' | *[!0-9]*) return 1 ;; esac
    proc_stat "$1" && [ "$ST_START" = "$2" ] && [ "$ST_STATE" != Z ]
}

# now: sets NOW to the Unix time in seconds, from the boot time and the uptime (no fork). The
# boot time is read once per shell (SUP_BT, empty at the start of every snippet): /proc/stat is
# read byte by byte up to its btime line.
# shellcheck disable=SC2034 # NOW is read by supervise.sh only
now() {
    if [ -z "$SUP_BT" ]; then
        while read -r _k _v; do
            if [ "$_k" = btime ]; then
                SUP_BT=$_v
                break
            fi
        done </proc/stat
    fi
    read -r _up _x </proc/uptime
    case $SUP_BT in
    '' | *[!0-9]*) NOW=$(date +%s) ;;
    *) NOW=$((SUP_BT + ${_up%.*})) ;;
    esac
}
SUP_BT=''

# uptime_cs: sets CS to the uptime in hundredths of a second (no fork).
uptime_cs() {
    read -r _up _x </proc/uptime
    case $_up in
    *.??) CS=${_up%.*}${_up#*.} ;;
    *.?) CS=${_up%.*}${_up#*.}0 ;;
    *) CS=${_up%.*}00 ;;
    esac
    # No leading zeros: shell arithmetic would read them as octal.
    while :; do
        case $CS in 0?*) CS=${CS#0} ;; *) break ;; esac
    done
}

boot_id() {
    BOOT=''
    read -r BOOT 2>/dev/null </proc/sys/kernel/random/boot_id
}

# sig_group SIG PGID: the builtin kill to a whole group; never group 0 or 1. dash needs `--`
# before a negative pid, busybox refuses it: probe once.
if kill -s 0 -- "$$" 2>/dev/null; then SUP_DD=--; else SUP_DD=; fi
sig_group() {
    case $2 in '' | *[!0-9]* | 0 | 1) return 2 ;; esac
    kill -s "$1" $SUP_DD "-$2" 2>/dev/null
}

# state_keys: the state lines of an answer, from the S_* and E_* variables.
state_keys() {
    printf 'status=%s\nexit_code=%s\nstarted_at=%s\nfinished_at=%s\ntimeout=%s\nerror=%s\nescaped=%s\nlive=%s\ngroup=%s\n' \
        "$S_status" "$S_exit_code" "$S_started_at" "$S_finished_at" "$S_timeout" "$S_error" "$S_escaped" "$E_live" "$E_group"
}

# task_root: sets ROOT, the directory of this user's tasks; answers @error nohome without HOME.
# shellcheck disable=SC2034 # ROOT is read by every snippet but supervise.sh
task_root() {
    [ -n "$HOME" ] || {
        printf '@error nohome HOME is not set in the sandbox\n'
        exit 0
    }
    ROOT=$HOME/.sandbox-mcp/tasks
}
