# start.sh: claims a task directory, starts the supervisor fully detached, waits for its word and
# prints the observed snapshot. Arguments and preamble (MAX_TASKS): see the table in
# src/supervisor/mod.rs.
# The wait is no watch: the supervisor's stdout is this snippet's pipe, and it closes it once the
# task runs in its own group (or has already ended): reading that pipe to its end is the wait.
# Every process started here delays the answer, so this path uses builtins wherever it can.

# claim: checks for setsid, then creates and claims the task directory D=$ROOT/$ID (state `claimed`, the cmd file);
# prints an `@error` line and fails when it cannot. Needs ID, T, CMD and ROOT.
claim() {
    command -v setsid >/dev/null || {
        printf '@error nosetsid the sandbox has no setsid command, which background tasks need\n'
        return 1
    }
    [ -d "$ROOT" ] || { mkdir -p "$ROOT" && chmod 700 "$HOME/.sandbox-mcp" "$ROOT"; } || {
        printf '@error noroot cannot create %s\n' "$ROOT"
        return 1
    }
    # Count, claim, count again: two racing starts at the limit may both refuse, never both pass.
    _n=0
    for _t in "$ROOT"/*/; do [ -d "$_t" ] && _n=$((_n + 1)); done
    [ "$_n" -lt "$MAX_TASKS" ] || {
        printf '@error limit %s\n' "$_n"
        return 1
    }
    D=$ROOT/$ID
    mkdir "$D" || {
        printf '@error claim cannot create %s\n' "$D"
        return 1
    }
    # Nobody else writes into a directory this start just claimed. The claim time lets
    # delete_task tell a start in progress from a dead one.
    uptime_cs
    # A claim that cannot be written (a full disk) starts nothing: a supervisor could not record
    # what it observes either.
    if ! printf 'status=claimed\ntimeout=%s\nclaimed_cs=%s\n.\n' "$T" "$CS" >"$D/state" || ! printf '%s' "$CMD" >"$D/cmd"; then
        rm -rf "$D"
        printf '@error write cannot write the task files in %s (is the disk of the sandbox full?); nothing was started\n' "$D"
        return 1
    fi
    _n=0
    for _t in "$ROOT"/*/; do [ -d "$_t" ] && _n=$((_n + 1)); done
    if [ "$_n" -gt "$MAX_TASKS" ]; then
        rm -rf "$D"
        printf '@error limit %s\n' "$MAX_TASKS"
        return 1
    fi
}

start() {
    ID=$1 T=$2 TSH=$3 CWD=$4 CMD=$5 SUP=$6 SH=$7 LIMIT=$8
    exec 3>&2 2>/dev/null
    umask 077
    task_root
    [ -n "$CWD" ] || CWD=$HOME
    # The supervisor works from the task directory: make a relative cwd absolute here, where it
    # means what run_command means by it.
    case $CWD in /*) ;; *) CWD=$PWD/$CWD ;; esac
    [ -d "$CWD" ] || {
        printf '@error nocwd cwd %s is not an existing directory\n' "$CWD"
        return
    }
    claim || return
    : >"$D/stdout.log"
    : >"$D/stderr.log"
    # The supervisor's stdout is the pipe of this command substitution; every other descriptor of
    # this call is closed for it (fd 3 is our stderr): anything it kept open would hold the
    # caller's exec until the task ends. Its arguments follow this snippet's own order (timeout,
    # task shell, cwd, command).
    _word=$(setsid "$SH" -c "$SUP" sh supervise "$D" "$T" "$TSH" "$CWD" "$CMD" </dev/null 2>>"$D/supervisor.err" 3>&- &)
    # (Empty when the supervisor died before its word: the state then says what it saw.)
    : "$_word"
    emit "$D" 0 0 "$LIMIT"
}

# adopt ID TIMEOUT LEFT PGID OUT_PRE ERR_PRE OUT_TRUNC ERR_TRUNC STARTED_AT COMMAND SUPERVISE_PROGRAM SH:
# a run_command still running at --task-after becomes task ID. Its stdout and stderr pipes'
# read ends arrive as this snippet's stdin and stderr. Claims the directory like a start, moves
# in the output the server captured before (staged by the server as $ROOT/.adopt-ID.stdout.log
# and .stderr.log, already masked; OUT_PRE and ERR_PRE bytes, OUT_TRUNC and ERR_TRUNC 1 when it was cut at
# the cap), then starts the supervisor in its adopt mode fully detached with the pipes on fds 7
# and 8, and prints `@adopted WORD` (WORD: the supervisor's, `running`) or `@error ...`.
adopt() {
    ID=$1 T=$2 LEFT=$3 TPID=$4 OUT_PRE=$5 ERR_PRE=$6 OUT_TR=$7 ERR_TR=$8 STARTED=$9
    CMD=${10} SUP=${11} SH=${12}
    exec 7<&0 8<&2 </dev/null 2>/dev/null
    umask 077
    task_root
    claim || {
        rm -f "$ROOT/.adopt-$ID".*
        return
    }
    # (The server may have made the directories holding the staged files: they are private.)
    chmod 700 "$HOME/.sandbox-mcp" "$ROOT"
    for _l in stdout.log stderr.log; do
        mv -f "$ROOT/.adopt-$ID.$_l" "$D/$_l" || : >"$D/$_l"
    done
    chmod 600 "$D/stdout.log" "$D/stderr.log"
    [ "$OUT_TR" = 1 ] && : >"$D/out.trunc"
    [ "$ERR_TR" = 1 ] && : >"$D/err.trunc"
    # As in start: the supervisor's word comes through the pipe of this command substitution.
    _word=$(setsid "$SH" -c "$SUP" sh adopt "$D" "$T" "$LEFT" "$TPID" "$OUT_PRE" "$ERR_PRE" "$STARTED" </dev/null 2>>"$D/supervisor.err" &)
    printf '@adopted %s\n' "$_word"
}

case $1 in
adopt)
    shift
    adopt "$@"
    ;;
*) start "$@" ;;
esac
