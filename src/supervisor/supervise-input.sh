# supervise-input.sh: the supervisor's part for a task with input (INPUT `stdin`, or
# `pty ROWS COLS`), sent at supervise.sh's `# @input` line only in the program of such a start.
# Arguments and files: see "Input" in src/supervisor/mod.rs.

# PTY_WRAP: what script(1) runs on a pty task's terminal: records its pid (the session's leader,
# which keeps it through the exec) and its terminal in the task directory's `pty` (resize.sh
# reads it), sets the asked size, then runs the command with the task shell and the task's own
# environment (its SHELL restored, the wrapper's variables gone; TERM xterm-256color where the
# environment has none, since full-screen programs need one).
# shellcheck disable=SC2016 # a program for script's shell: its $ are that shell's
PTY_WRAP='printf "%s %s\n" "$$" "$(tty)" >"$SANDBOX_MCP_PTY"
set -- $SANDBOX_MCP_SIZE
stty rows "$1" cols "$2" 2>/dev/null
[ -n "$TERM" ] || TERM=xterm-256color
export TERM
c=$SANDBOX_MCP_CMD t=$SANDBOX_MCP_TSH
if [ -n "$SANDBOX_MCP_SHELL" ]; then SHELL=$SANDBOX_MCP_SHELL; else unset SHELL; fi
unset SANDBOX_MCP_CMD SANDBOX_MCP_TSH SANDBOX_MCP_PTY SANDBOX_MCP_SIZE SANDBOX_MCP_SHELL
exec $t -c "$c"'

# open_input: the task's input channel in the task directory (the current directory): `input`
# (INPUT), the FIFOs `stdin` (the task's stdin, or what script(1) types into its terminal) and
# `stdin.eof`. A holder subshell keeps a writer on `stdin` (opened read-write: no open blocks),
# so that the task sees no end of input between two send_input calls; it lets go when a writer
# opens and closes `stdin.eof` (send_input's eof), or when close_input ends it, and marks
# `stdin.closed` either way. The server writes both FIFOs from outside, non-blocking.
open_input() {
    case $IN in pty*)
        command -v script >/dev/null 2>&1 ||
            give_up failed_to_start "the sandbox has no script command (util-linux), which a task with pty needs"
        ;;
    esac
    printf '%s\n' "$IN" >input
    mkfifo stdin stdin.eof 2>>supervisor.err ||
        give_up failed_to_start "mkfifo failed: a task with stdin or pty needs mkfifo and a filesystem that supports FIFOs"
    exec 5<>stdin
    (
        exec </dev/null >/dev/null 2>&1 6<&- 7>&- 8>&- 9>&-
        read -r _x <stdin.eof
        : >stdin.closed
    ) &
    HOLDER=$!
    exec 5>&-
    proc_stat "$HOLDER" && HOLDER_START=$ST_START
}

# close_input: ends the holder (the task has ended): no writer reaches a reader any more.
close_input() {
    alive "$HOLDER" "$HOLDER_START" && kill -s KILL "$HOLDER" 2>/dev/null
    : >stdin.closed
}

# start_input: starts the task (in CWD, globbing off) with the FIFO as its stdin; with a pty,
# script(1) allocates the terminal in the sandbox, makes it the controlling terminal of a new
# session for PTY_WRAP, copies the typed input from the FIFO to it and the terminal's output to
# the stdout pipe. script runs $SHELL -c: POSIX sh here, the task's own SHELL restored inside.
start_input() {
    case $IN in
    pty*)
        _shell=${SHELL-}
        # A background command of a shell ignores SIGINT, and so would everything on the
        # terminal: Ctrl-C must interrupt there, so the default comes back where env can do it.
        _ds=''
        env --default-signal=INT true 2>/dev/null && _ds='env --default-signal=INT'
        # shellcheck disable=SC2086 # _ds is a command and its flag, split on purpose
        SANDBOX_MCP_TASK=$ID SANDBOX_MCP_CMD=$CMD SANDBOX_MCP_TSH=$TSH SANDBOX_MCP_PTY=$D/pty SANDBOX_MCP_SIZE=${IN#pty } \
            SANDBOX_MCP_SHELL=$_shell SHELL=$SH setsid $_ds script -qfec "$PTY_WRAP" /dev/null <"$D/stdin" >&7 2>&8 6<&- 7>&- 8>&- 9>&- &
        ;;
    *)
        # shellcheck disable=SC2086 # the task shell and its flags, split as above
        SANDBOX_MCP_TASK=$ID setsid $TSH -c "$CMD" <"$D/stdin" >&7 2>&8 6<&- 7>&- 8>&- 9>&- &
        ;;
    esac
}
