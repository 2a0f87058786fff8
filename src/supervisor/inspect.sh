# inspect.sh: the helpers that read tasks (their state files, logs and process groups), sent
# after common.sh (see there for where).

# Seconds one scan of environments may take (see environ_has).
ENVIRON_READ_S=2

# environ_has TAG FILE... and environ_list TAG FILE...: whether one of the /proc/PID/environ
# FILEs holds TAG, and which ones do. Reading another process's environment takes that process's
# memory-map lock, which a process under memory pressure can hold for a long time: the reads are
# bounded by `timeout` (the read is killable) where it exists, and callers pass only the few
# processes that can matter, never all of /proc.
environ_has() {
    environ_grep -q "$@"
}

environ_list() {
    environ_grep -l "$@"
}

environ_grep() {
    command -v grep >/dev/null 2>&1 || return 1
    _o=$1 _tag=$2
    shift 2
    if command -v timeout >/dev/null 2>&1; then
        timeout -s KILL "$ENVIRON_READ_S" grep "$_o" -a -F "$_tag" "$@" 2>/dev/null
    else
        grep "$_o" -a -F "$_tag" "$@" 2>/dev/null
    fi
}

# group_tagged PGID ID: a live (non-zombie) member of that group carries task ID's environment tag.
# The tag is what proves the group is still the task's: once a group empties, its id can be
# reused by an unrelated group (fast in a small pid namespace), and membership alone would
# then point at strangers. Only the group's members are read.
group_tagged() {
    case $1 in '' | *[!0-9]* | 0 | 1) return 1 ;; esac
    set -- "$1" "$2"
    for _p in /proc/[0-9]*; do
        proc_stat "${_p#/proc/}" || continue
        [ "$ST_PGID" = "$1" ] && [ "$ST_STATE" != Z ] && [ -O "$_p" ] && set -- "$@" "$_p/environ"
    done
    [ $# -gt 2 ] || return 1
    _id=$2
    shift 2
    environ_has "SANDBOX_MCP_TASK=$_id" "$@"
}

# sig_task SIG PGID LEADER_START ID: signal task ID's group only while it is provably still the
# task's: its leader with the recorded start time exists (a zombie leader still holds the id), or
# a live member carries the task's tag.
sig_task() {
    case $2 in '' | *[!0-9]* | 0 | 1) return 2 ;; esac
    if proc_stat "$2" && [ "$ST_PGID" = "$2" ] && [ "$ST_START" = "$3" ]; then
        sig_group "$1" "$2"
        return
    fi
    group_tagged "$2" "$4" && sig_group "$1" "$2"
}

# regular FILE: a regular file, not a link (sandbox code may put a FIFO there).
regular() {
    [ -f "$1" ] && [ ! -h "$1" ]
}

# read_state DIR: loads DIR/state into S_* variables. Never sourced. The file is a series of
# blocks of key=value lines, each ending with a `.` line; writers append whole blocks and the
# last complete block holds the state (a block being appended is ignored until its `.`). A file
# without any `.` line (written by an older version) is one block.
# shellcheck disable=SC2034 # each snippet reads the keys it needs
read_state() {
    state_clear
    regular "$1/state" && [ -r "$1/state" ] || return 1
    _blocks=0 _open=0
    while IFS= read -r _l || [ -n "$_l" ]; do
        case $_l in
        .)
            state_keep
            _blocks=1 _open=0
            continue
            ;;
        esac
        [ "$_open" = 1 ] || state_clear
        _open=1
        case $_l in
        status=*) S_status=${_l#*=} ;;
        boot_id=*) S_boot_id=${_l#*=} ;;
        sup_pid=*) S_sup_pid=${_l#*=} ;;
        sup_start=*) S_sup_start=${_l#*=} ;;
        pgid=*) S_pgid=${_l#*=} ;;
        task_start=*) S_task_start=${_l#*=} ;;
        timeout=*) S_timeout=${_l#*=} ;;
        started_at=*) S_started_at=${_l#*=} ;;
        finished_at=*) S_finished_at=${_l#*=} ;;
        exit_code=*) S_exit_code=${_l#*=} ;;
        error=*) S_error=${_l#*=} ;;
        escaped=*) S_escaped=${_l#*=} ;;
        out_bytes=*) S_out_bytes=${_l#*=} ;;
        err_bytes=*) S_err_bytes=${_l#*=} ;;
        out_truncated=*) S_out_truncated=${_l#*=} ;;
        err_truncated=*) S_err_truncated=${_l#*=} ;;
        claimed_cs=*) S_claimed_cs=${_l#*=} ;;
        esac
    done <"$1/state"
    # An unfinished last block: the last complete one is the state.
    [ "$_open" = 1 ] && [ "$_blocks" = 1 ] && state_restore
    [ -n "$S_status" ]
}

# shellcheck disable=SC2034 # read by the snippets
state_clear() {
    S_status='' S_boot_id='' S_sup_pid='' S_sup_start='' S_pgid='' S_task_start='' S_timeout=''
    S_started_at='' S_finished_at='' S_exit_code='' S_error='' S_escaped='' S_out_bytes=''
    S_err_bytes='' S_claimed_cs='' S_out_truncated='' S_err_truncated=''
}

state_keep() {
    K_status=$S_status K_boot_id=$S_boot_id K_sup_pid=$S_sup_pid K_sup_start=$S_sup_start K_pgid=$S_pgid
    K_task_start=$S_task_start K_timeout=$S_timeout K_started_at=$S_started_at K_finished_at=$S_finished_at
    K_exit_code=$S_exit_code K_error=$S_error K_escaped=$S_escaped K_out_bytes=$S_out_bytes
    K_err_bytes=$S_err_bytes K_claimed_cs=$S_claimed_cs K_out_truncated=$S_out_truncated K_err_truncated=$S_err_truncated
}

# shellcheck disable=SC2034 # read by the snippets
state_restore() {
    S_status=$K_status S_boot_id=$K_boot_id S_sup_pid=$K_sup_pid S_sup_start=$K_sup_start S_pgid=$K_pgid
    S_task_start=$K_task_start S_timeout=$K_timeout S_started_at=$K_started_at S_finished_at=$K_finished_at
    S_exit_code=$K_exit_code S_error=$K_error S_escaped=$K_escaped S_out_bytes=$K_out_bytes
    S_err_bytes=$K_err_bytes S_claimed_cs=$K_claimed_cs S_out_truncated=$K_out_truncated S_err_truncated=$K_err_truncated
}

is_final() {
    case $S_status in exited | failed_to_start | timed_out | cancelled) return 0 ;; esac
    return 1
}

# emit_state DIR: the state lines plus the derived liveness (`live`, `group`), no log data.
emit_state() {
    printf '@task %s\n' "${1##*/}"
    if ! read_state "$1"; then
        printf 'status=unreadable\n@end\n'
        return
    fi
    E_live=- E_group=-
    case $S_status in
    running | starting)
        boot_id
        if [ "$BOOT" = "$S_boot_id" ] && alive "$S_sup_pid" "$S_sup_start"; then
            E_live=1
        elif ! read_state "$1"; then
            # Deleted since the first read.
            printf 'status=unreadable\n@end\n'
            return
        elif ! is_final; then
            # (Read again: a supervisor that saved its final state and exited after the first read
            # is not lost.)
            E_live=0
            if [ "$BOOT" = "$S_boot_id" ] && group_tagged "$S_pgid" "${1##*/}"; then E_group=1; else E_group=0; fi
        fi
        ;;
    esac
    state_keys
}

# page FD SIZE OFFSET LIMIT: bytes [OFFSET, min(SIZE, OFFSET+LIMIT)) of the log open on FD, on
# stdout.
page() {
    [ "$2" -gt "$3" ] 2>/dev/null || return 0
    _n=$(($2 - $3))
    [ "$_n" -gt "$4" ] && _n=$4
    if [ "$3" -eq 0 ]; then
        dd bs="$_n" count=1 <&"$1" 2>/dev/null
    elif ! dd bs="$_n" skip="$3" iflag=skip_bytes count=1 <&"$1" 2>/dev/null; then
        { dd bs="$3" skip=1 count=0 2>/dev/null && dd bs="$_n" count=1 2>/dev/null; } <&"$1"
    fi
}

# log_sizes: sets E_os and E_es to the sizes of stdout.log and stderr.log in the current
# directory. A log that is empty, or that its pump filled to the cap (its `.full` marker holds
# the size), needs no process; otherwise one `wc` counts both (0 for both when one is missing).
log_sizes() {
    E_os='' E_es=''
    [ -s stdout.log ] || E_os=0
    [ -s stderr.log ] || E_es=0
    [ -z "$E_os" ] && regular out.full && read -r E_os <out.full
    [ -z "$E_es" ] && regular err.full && read -r E_es <err.full
    case $E_os in *[!0-9]*) E_os='' ;; esac
    case $E_es in *[!0-9]*) E_es='' ;; esac
    [ -n "$E_os" ] && [ -n "$E_es" ] && return 0
    if regular stdout.log && regular stderr.log; then
        set -f
        # wc's counts and names, split into fields on purpose (globbing is off).
        # shellcheck disable=SC2046
        set -- $(wc -c stdout.log stderr.log 2>/dev/null)
        set +f
        E_os=${1:-0} E_es=${3:-0}
    else
        E_os=0 E_es=0
    fi
}

# emit DIR OUT_OFF ERR_OFF LIMIT: emit_state, the saved sizes, `@end`, then the stdout page on
# stdout and the stderr page on fd 3; `@none` alone for a finished task whose logs are gone.
# Uses fds 5 and 6.
#
# The logs are opened before the state is read, and the pages come from those descriptors: a
# finished task's state, whose sizes are its logs' final sizes, then always comes with its whole
# logs, even when the directory is removed meanwhile (a run's clean-up, a delete_task). A
# finished task always has both logs: one whose logs could not be opened is being removed, and
# reads as removed.
emit() {
    _l=
    command exec 5</dev/null 6</dev/null
    regular "$1/stdout.log" && command exec 5<"$1/stdout.log" && _l=o
    regular "$1/stderr.log" && command exec 6<"$1/stderr.log" && _l=e$_l
    if [ "$_l" != eo ] && read_state "$1" && is_final; then
        echo @none
        return 0
    fi
    emit_state "$1"
    [ -n "$S_status" ] || return 0
    if [ -n "$S_out_bytes" ] && [ -n "$S_err_bytes" ]; then
        E_os=$S_out_bytes E_es=$S_err_bytes
    elif cd "$1" 2>/dev/null; then
        log_sizes
    else
        E_os=0 E_es=0
    fi
    E_ot=${S_out_truncated:-0} E_et=${S_err_truncated:-0}
    [ -e "$1/out.trunc" ] && E_ot=1
    [ -e "$1/err.trunc" ] && E_et=1
    printf 'out_size=%s\nerr_size=%s\nout_truncated=%s\nerr_truncated=%s\n@end\n' "$E_os" "$E_es" "$E_ot" "$E_et"
    page 5 "$E_os" "$2" "$4"
    page 6 "$E_es" "$3" "$4" >&3
}
