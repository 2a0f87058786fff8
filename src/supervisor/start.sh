# start.sh: claims a task directory, starts the supervisor fully detached, waits for its first
# state and prints the observed snapshot. Arguments and preamble (MAX_TASKS): see the table in
# src/supervisor/mod.rs.

start() {
    ID=$1 T=$2 TSH=$3 CWD=$4 CMD=$5 SUP=$6 SH=$7 LIMIT=$8
    exec 3>&2 2>/dev/null
    umask 077
    task_root
    command -v setsid >/dev/null || {
        printf '@error nosetsid the sandbox has no setsid command, which background tasks need\n'
        return
    }
    [ -n "$CWD" ] || CWD=$HOME
    # The supervisor works from the task directory: make a relative cwd absolute here, where it
    # means what run_command means by it.
    case $CWD in /*) ;; *) CWD=$PWD/$CWD ;; esac
    [ -d "$CWD" ] || {
        printf '@error nocwd cwd %s is not an existing directory\n' "$CWD"
        return
    }
    [ -d "$ROOT" ] || { mkdir -p "$ROOT" && chmod 700 "$HOME/.sandbox-mcp" "$ROOT"; } || {
        printf '@error noroot cannot create %s\n' "$ROOT"
        return
    }
    # Count, claim, count again: two racing starts at the limit may both refuse, never both pass.
    _n=0
    for _t in "$ROOT"/*/; do [ -d "$_t" ] && _n=$((_n + 1)); done
    [ "$_n" -lt "$MAX_TASKS" ] || {
        printf '@error limit %s\n' "$_n"
        return
    }
    D=$ROOT/$ID
    mkdir "$D" || {
        printf '@error claim cannot create %s\n' "$D"
        return
    }
    # Nobody else writes into a directory this start just claimed: no rename needed here. The
    # claim time lets delete_task tell a start in progress from a dead one.
    uptime_cs
    # A claim that cannot be written (a full disk) starts nothing: a supervisor could not record
    # what it observes either.
    if ! printf 'status=claimed\ntimeout=%s\nclaimed_cs=%s\n' "$T" "$CS" >"$D/state" || ! printf '%s' "$CMD" >"$D/cmd"; then
        rm -rf "$D"
        printf '@error write cannot write the task files in %s (is the disk of the sandbox full?); nothing was started\n' "$D"
        return
    fi
    _n=0
    for _t in "$ROOT"/*/; do [ -d "$_t" ] && _n=$((_n + 1)); done
    if [ "$_n" -gt "$MAX_TASKS" ]; then
        rm -rf "$D"
        printf '@error limit %s\n' "$MAX_TASKS"
        return
    fi
    : >"$D/stdout.log"
    : >"$D/stderr.log"
    # Every descriptor of this call is closed for the supervisor (fd 3 is our stderr): anything
    # it kept open would hold the caller's exec until the task ends.
    # The supervisor's arguments follow this snippet's own order (timeout, task shell, cwd, command).
    setsid "$SH" -c "$SUP" sh supervise "$D" "$T" "$TSH" "$CWD" "$CMD" </dev/null >/dev/null 2>>"$D/supervisor.err" 3>&- &
    # Wait for the supervisor's first word; a task that ends at once is reported finished.
    _i=0 _r=0
    while :; do
        read_state "$D"
        is_final && break
        if [ "$S_status" = running ]; then
            _r=$((_r + 1))
            [ "$_r" -ge 4 ] && break
        elif [ "$_i" -ge 2000 ]; then
            break
        fi
        _i=$((_i + 1))
        [ "$_i" -ge 3 ] && sleep 0.005
    done
    # (A running task is watched for about 25 ms more, so that quick commands come back finished.)
    emit "$D" 0 0 "$LIMIT"
}

start "$@"
