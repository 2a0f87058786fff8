# start.sh: claims a task directory and starts the supervisor fully detached, both at once, waits
# for the supervisor's word and prints the observed snapshot. Arguments and preamble (MAX_TASKS):
# see the table in src/supervisor/mod.rs.
# The wait is no watch: the supervisor's stdout is this snippet's pipe, and it closes it once the
# task runs in its own group (or has already ended): reading that pipe to its end is the wait.
# Every process started here delays the answer, so this path uses builtins wherever it can, and
# the claim (a `mkdir`) runs beside the supervisor's own start (a `setsid` and a shell) instead of
# before it. A relayed answer ends the snippet (`exit`), so that it never parses inspect.sh.

# claim: counts, claims the directory D=$ROOT/$ID (mkdir), counts again and writes the claim
# (state `claimed`, the cmd file); prints an `@error KIND MESSAGE` line and fails when it cannot
# (nothing is then claimed). Needs ID, T, CMD, ROOT and D. start runs it as the first command of
# a pipeline whose second is the supervisor, adopt before its supervisor.
claim() {
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

# run: start's wait mode (WAIT seconds, a run_command that may outlive --task-after on a
# provider whose command pipes cannot be handed over): the supervisor keeps its word until the
# task has ended and its final state is saved (`@over`) or until its timer has waited WAIT
# seconds (`@wait`), and this snippet then answers with the whole logs (LIMIT) and, when the task
# has ended, removes its directory: a command that ends in time leaves nothing behind. The word
# comes through a pipe of which this shell holds only the read end (fd 5: a here-document, whose
# write end is reopened through /proc/self/fd for the supervisor and then closed here), so that a
# supervisor that dies without a word ends the wait too (the state then says what it saw). Where
# here-documents are files, the answer is `@error nowait` and nothing is started.
run() {
    exec 5<<'E'
x
E
    if ! [ -p /proc/self/fd/5 ] || ! read -r _x <&5 || ! command exec 6>/proc/self/fd/5; then
        printf '@error nowait the sandbox shell keeps here-documents in files\n'
        exit 0
    fi
    {
        exec 3>&- 5<&- 6>&-
        claim && {
            : >"$D/stdout.log"
            : >"$D/stderr.log"
            printf 'go\n'
        }
    } | setsid "$SH" -c "$SUP" sh supervise "$D" "$T" "$TSH" "$CWD" "$CMD" "$WAIT" >&6 3>&- 5<&- 6>&- &
    exec 6>&-
    _word=''
    IFS= read -r _word <&5
    exec 5<&-
    case $_word in @error*)
        printf '%s\n' "$_word"
        exit 0
        ;;
    esac
}

start() {
    ID=$1 T=$2 TSH=$3 CWD=$4 CMD=$5 SUP=$6 SH=$7 LIMIT=$8 WAIT=${9:-0} IN=${10-}
    exec 3>&2 2>/dev/null
    umask 077
    task_root
    command -v setsid >/dev/null || {
        printf '@error nosetsid the sandbox has no setsid command, which background tasks need\n'
        exit 0
    }
    [ -n "$CWD" ] || CWD=$HOME
    # The supervisor works from the task directory: make a relative cwd absolute here, where it
    # means what run_command means by it.
    case $CWD in /*) ;; *) CWD=$PWD/$CWD ;; esac
    [ -d "$CWD" ] || {
        printf '@error nocwd cwd %s is not an existing directory\n' "$CWD"
        exit 0
    }
    D=$ROOT/$ID
    if [ "$WAIT" != 0 ]; then
        run
        return
    fi
    # fd 4: a pipe that only this shell holds open for writing, until it exits (a here-document
    # reopened read-write, as in supervise.sh's open_pipes; no process). The supervisor waits for
    # its end before it starts the pumps and the timer, which would otherwise compete with the
    # rest of this answer for the processor. (Where it is no pipe, the supervisor does not wait.)
    exec 4<<'E'
x
E
    [ -p /proc/self/fd/4 ] && read -r _x <&4 && command exec 4<>/proc/self/fd/4
    # The claim's line is the supervisor's stdin; the supervisor's stdout is the pipe of this
    # command substitution. Every other descriptor of this call is closed for both (fd 3 is our
    # stderr): anything they kept open would hold the caller's exec until the task ends. The
    # supervisor's arguments follow this snippet's own order (timeout, task shell, cwd, command).
    # The claim's end of it prints `go` once the directory is claimed, or the refusal.
    _word=$({
        exec 3>&- 4>&-
        claim && {
            : >"$D/stdout.log"
            : >"$D/stderr.log"
            printf 'go\n'
        }
    } | setsid "$SH" -c "$SUP" sh supervise "$D" "$T" "$TSH" "$CWD" "$CMD" 0 "$IN" "$SH" 3>&- &)
    # The supervisor's word: the snapshot of the running task, a refused claim (passed on), or
    # nothing when the task has already ended or the supervisor died before its word (the state
    # then says what it saw).
    case $_word in
    @task* | @error*)
        printf '%s\n' "$_word"
        exit 0
        ;;
    esac
}

[ "$1" = adopt ] || start "$@"
# Only an adoption, a task that has already ended, or a supervisor that died before its word
# gets here: inspect.sh's helpers, sent at the next line, read the state and the logs.
# @inspect
# An adoption's program has start-adopt.sh at the next line (it ends there); a start's has nothing.
# @adopt
emit "$D" 0 0 "$LIMIT"
# A run (see there) that ended in time leaves nothing behind; the removal does not delay the
# answer (no descriptor of this call stays open for it).
if [ "${WAIT:-0}" != 0 ] && is_final; then
    cd / && rm -rf "$D" >/dev/null 2>&1 3>&- &
fi
