# supervise.sh: the detached supervisor of one task, its output pumps and its timer.
# The server prepends the preamble (LOG_CAP, TERM_GRACE_CS) and common.sh, and sends
# MASK_AWK='...' (the masker program) and inspect.sh at the `# @inspect` line, after the answer;
# start.sh runs it fully detached, with its stdout on start.sh's pipe and its stdin on the
# claim's (see start.sh). An adoption's start.sh runs it in adopt mode, which skips `launch` and
# runs `adopt` from supervise-adopt.sh, sent at the `# @adopt` line only in an adoption's program.
# Arguments: see the table in src/supervisor/mod.rs.
# It writes DIR/state only through `save` (a whole block appended). Every process started on the
# way to `running` delays the answer of start_task, and so does every line parsed: that path uses
# builtins wherever it can, no sleep or watch, and comes first in this file.

save() {
    # One line per value: an error that quotes user input (a cwd) must not forge other keys.
    case $ERR in *"
"*) ERR=$(printf '%s' "$ERR" | tr '\n' ' ') ;; esac
    # One block appended, `.` last: readers take the last complete block. When the append fails
    # (a full disk), the state file is rewritten in place, in the space it already holds: better
    # than losing an observed outcome, at the cost of a moment in which a reader finds it empty
    # (and says unknown).
    if ! state_lines "$1" >>state; then
        state_lines "$1" >state
    fi
}

# state_lines STATUS: one block of the state file; fails when any write fails.
state_lines() {
    printf 'status=%s\nboot_id=%s\nsup_pid=%s\nsup_start=%s\npgid=%s\ntask_start=%s\ntimeout=%s\nstarted_at=%s\n' \
        "$1" "$BOOT" "$SUP_PID" "$SUP_START" "$TPID" "$TSTART" "$T" "$STARTED" &&
        printf 'finished_at=%s\nexit_code=%s\nerror=%s\nescaped=%s\n' "$FINISHED" "$RC" "$ERR" "$ESCAPED" &&
        if [ -n "$OUT_BYTES" ]; then
            printf 'out_bytes=%s\nerr_bytes=%s\nout_truncated=%s\nerr_truncated=%s\n' "$OUT_BYTES" "$ERR_BYTES" "$OUT_TRUNC" "$ERR_TRUNC"
        fi &&
        printf '.\n'
}

# open_pipes: fds 7 and 8 become the task's stdout and stderr pipes, each open for reading and
# writing, so that no open blocks and no write fails before the pumps read: the task starts at
# once, and its first bytes wait in the pipes. A short here-document is a pipe in dash, busybox
# ash and bash 5.1+ (no process); once its line is read, reopening it through /proc/self/fd gives
# a descriptor that reads and writes. Sets PIPES to `proc` when that worked; otherwise (a shell
# that keeps here-documents in files) the caller makes FIFOs in the task directory (`mkfifo`, one
# process). Each pump opens its own read end from these (OUT_PIPE, ERR_PIPE).
open_pipes() {
    PIPES=''
    exec 7<<'E'
x
E
    exec 8<<'E'
x
E
    [ -p /proc/self/fd/7 ] && [ -p /proc/self/fd/8 ] || return 0
    read -r _x <&7
    read -r _x <&8
    command exec 7<>/proc/self/fd/7 8<>/proc/self/fd/8 && PIPES=proc
}

# give_up STATUS [ERROR]: a final state before the task ran.
give_up() {
    exec 7>&- 8>&-
    [ -z "$HOLDER" ] || close_input
    ERR=${2-}
    now
    FINISHED=$NOW
    save "$1"
    exit 0
}

# A start with INPUT has supervise-input.sh at the next line (open_input, close_input and
# start_input, the task's start with its input); the others have nothing.
# @input

# launch DIR TIMEOUT TASK_SHELL CWD COMMAND WAIT INPUT SH: everything up to start.sh's answer: waits for
# the claim, starts the task in its own group, confirms it and answers (RUNNING=1), or finds that
# the task has already ended (RUNNING empty). With WAIT (seconds, not 0: start.sh's run) the
# answer is one line instead, written later: `@over` once the final state is saved, or the
# timer's `@wait` after WAIT seconds, whichever comes first.
launch() {
    # shellcheck disable=SC2034 # SH is read by supervise-input.sh only
    D=$1 T=$2 TSH=$3 CWD=$4 CMD=$5 WAIT=${6:-0} IN=${7-} SH=${8:-/bin/sh}
    ID=${D##*/}
    # fd 9: start.sh's pipe, closed once the task is confirmed (that is start.sh's answer).
    # Only the children that outlive that moment close it, each for itself.
    exec 9>&1 >/dev/null
    # fd 6: start.sh's pipe that ends when start.sh exits (see there), read-only; fd 4 is this
    # shell's read-write copy of it, which would keep it open.
    if [ -p /proc/self/fd/4 ]; then exec 6</proc/self/fd/4; else exec 6</dev/null; fi
    exec 4>&-
    umask 077
    # What needs no task directory comes first: start.sh's claim runs beside this.
    SUP_PID=$$
    proc_stat "$$" && SUP_START=$ST_START
    boot_id
    now
    STARTED=$NOW
    TPID='' TSTART='' RC='' ERR='' FINISHED='' OUT_BYTES='' ESCAPED=0 MASK='' RUNNING='' TMR=
    HOLDER=''
    ADOPT='' LEFT='' OUT_PRE=0 ERR_PRE=0
    # The task shell (for example /bin/bash -l) falls back to /bin/sh where it does not exist.
    set -f
    # The task shell is a program and its flags: split on purpose (globbing is off).
    # shellcheck disable=SC2086
    set -- $TSH
    set +f
    [ -x "$1" ] || TSH=/bin/sh
    open_pipes
    # The claim's one line (see start.sh): a refusal is start.sh's answer, and an interrupted
    # claim (no line) starts nothing.
    _claim=''
    IFS= read -r _claim
    exec </dev/null
    case $_claim in
    go) ;;
    @error*)
        printf '%s\n' "$_claim" >&9
        exit 0
        ;;
    *) exit 0 ;;
    esac
    cd "$D" || exit 1
    exec 2>>supervisor.err
    if [ "$PIPES" = proc ]; then
        OUT_PIPE=/proc/self/fd/7 ERR_PIPE=/proc/self/fd/8
    else
        # FIFOs, opened read-write for the same reasons as the pipes.
        if ! mkfifo out.fifo err.fifo 2>>supervisor.err; then
            give_up failed_to_start "mkfifo failed: the sandbox needs mkfifo and a filesystem that supports FIFOs"
        fi
        exec 7<>out.fifo 8<>err.fifo
        OUT_PIPE=out.fifo ERR_PIPE=err.fifo
    fi
    [ -e cancel ] && give_up cancelled
    [ -z "$IN" ] || open_input
    cd "$CWD" 2>/dev/null || give_up failed_to_start "cwd $CWD no longer exists"
    set -f
    if [ -n "$IN" ]; then
        start_input
    else
        # shellcheck disable=SC2086 # the task shell and its flags, split as above
        SANDBOX_MCP_TASK=$ID setsid $TSH -c "$CMD" </dev/null >&7 2>&8 6<&- 7>&- 8>&- 9>&- &
    fi
    TPID=$!
    set +f
    cd "$D" || exit 1
    # The child calls setsid() only after the fork: until its group exists, a group signal would
    # reach nobody. Confirm before publishing `running` or arming the timer. A group whose id is
    # the task's pid can only be the task's (a pid is not reused while a group holds it), and
    # signal 0 to it is one system call: look that way without a process first (setsid takes a
    # fraction of a millisecond), reading /proc only now and then to notice a task that ended
    # before its setsid(), then poll.
    _i=0
    until sig_group 0 "$TPID"; do
        _i=$((_i + 1))
        if [ $((_i % 64)) -eq 0 ]; then
            if ! proc_stat "$TPID" || [ "$ST_STATE" = Z ]; then break; fi
        fi
        [ "$_i" -ge 4500 ] && break
        [ "$_i" -ge 4000 ] && sleep 0.01
    done
    if proc_stat "$TPID" && [ "$ST_PGID" = "$TPID" ]; then TSTART=$ST_START; fi
    if [ "$ST_STATE" != Z ] && [ "$WAIT" != 0 ]; then
        save running
        RUNNING=1
    elif [ "$ST_STATE" != Z ]; then
        save running
        # start.sh's answer: the task runs in its own group. This shell prints the snapshot
        # itself (it knows every value; the logs are still empty, since the pumps start after
        # it), so that start.sh has nothing left to read. What follows (the pumps, the timer) is
        # not on the way to it.
        S_status=running S_exit_code='' S_started_at=$STARTED S_finished_at='' S_timeout=$T S_error='' S_escaped=0 E_live=1 E_group=-
        {
            printf '@task %s\n' "$ID"
            state_keys
            printf 'out_size=0\nerr_size=0\nout_truncated=0\nerr_truncated=0\n@end\n'
        } >&9
        exec 9>&-
        # Nothing more is on the way to the answer, but start.sh, the provider's exec and the
        # server still have to pass it on: wait (blocked, using no processor) until start.sh
        # has exited.
        read -r _x <&6
        RUNNING=1
    fi
    exec 6<&-
    # (The task has already ended otherwise: start.sh answers with its end, once `finish` below
    # has saved it.)
}

MODE=$1 WAIT=0
shift
case $MODE in
supervise) launch "$@" ;;
adopt) ;;
*) exit 0 ;;
esac
# What follows is parsed only after the answer (adopt mode has none to hurry): the masker,
# inspect.sh, the pumps, the timer and the end of the task.
# @inspect

# wants_mask: whether a variable of this environment is a secret to mask. The names and values of
# /proc/self/environ (this shell's own, which the task inherits) are read with the builtin
# `read`, which drops the NUL separators: a name that could be a secret's is found without a
# process, and only then does the masker itself decide (values shorter than its minimum are not
# masked).
wants_mask() {
    _e=''
    while IFS= read -r _l || [ -n "$_l" ]; do _e="$_e $_l"; done </proc/self/environ
    case $_e in
    *[Kk][Ee][Yy]* | *[Tt][Oo][Kk][Ee][Nn]* | *[Ss][Ee][Cc][Rr][Ee][Tt]* | *[Pp][Aa][Ss][Ss][Ww][Oo][Rr][Dd]*)
        LC_ALL=C awk -v check=1 "$MASK_AWK" </dev/null >/dev/null 2>&1
        ;;
    *) return 1 ;;
    esac
}

# pick_tools: sets PLAIN (how the unmasked pump copies exactly LOG_CAP bytes), PRELOAD (see
# below) and AWK (the masker's awk with its flags), probed once per OS user and remembered in the
# tasks directory.
pick_tools() {
    PRELOAD=''
    if [ -e ../.pump-gnu ]; then
        PLAIN=gnu
        read -r PRELOAD <../.pump-gnu
        case $PRELOAD in /*/libstdbuf.so) ;; *) PRELOAD='' ;; esac
    elif [ -e ../.pump-bytes ]; then
        PLAIN=bytes
    elif [ -e ../.pump-slow ]; then
        PLAIN=slow
    else
        # GNU head -c reads no byte past its count, and with an unbuffered stdout (stdbuf) writes
        # each read at once; busybox dd counts bytes exactly (GNU dd counts a short read of a
        # pipe as a whole block); anything else copies byte by byte.
        case $(dd --version 2>/dev/null) in
        *coreutils*) if stdbuf -o0 head -c 1 </dev/null >/dev/null 2>&1; then PLAIN=gnu; else PLAIN=slow; fi ;;
        *) if dd bs=1 count=1 iflag=count_bytes </dev/null >/dev/null 2>&1; then PLAIN=bytes; else PLAIN=slow; fi ;;
        esac
        # stdbuf only sets two variables (the library it preloads, and _STDBUF_O) and runs its
        # command: setting them here saves each pump a program start. PRELOAD is that library,
        # as stdbuf itself names it, once head is seen to start with it; otherwise empty, and
        # the pumps run stdbuf.
        if [ "$PLAIN" = gnu ]; then
            # (Single quotes on purpose: the variable is the inner shell's.)
            # shellcheck disable=SC2016
            PRELOAD=$(stdbuf -o0 sh -c 'printf %s "$LD_PRELOAD"' 2>/dev/null)
            PRELOAD=${PRELOAD%%:*}
            case $PRELOAD in
            */libstdbuf.so)
                _STDBUF_O=0 LD_PRELOAD=$PRELOAD head -c 1 </dev/null >/dev/null 2>&1 || PRELOAD=''
                ;;
            *) PRELOAD='' ;;
            esac
        fi
        printf '%s\n' "$PRELOAD" >"../.pump-$PLAIN"
    fi
    [ -n "$MASK" ] || return 0
    if [ -e ../.awk-mawk ]; then
        AWK='awk -W interactive'
    elif [ -e ../.awk-plain ]; then
        AWK='awk'
    else
        # mawk holds lines back unless interactive.
        case $(awk -W version </dev/null 2>&1) in
        *mawk*) AWK='awk -W interactive' && : >../.awk-mawk ;;
        *) AWK='awk' && : >../.awk-plain ;;
        esac
    fi
}

# pump NAME LOG [PRE]: copies the task's stream (fd 5, its read end of the pipe; in adopt mode
# the command's own pipe) into LOG, at most LOG_CAP bytes less the PRE bytes LOG already holds,
# then drains the rest in one process reading large blocks (one pipe hop, no process per chunk).
# NAME.trunc appears at the first dropped byte (after NAME.full, the size of a log filled to the
# cap, or NAME.wfail); NAME.meta gets "written dropped" at the end
# (written is - when only the log's size says). When writing LOG fails (a full disk) it still
# drains the stream, so that the task is neither blocked nor killed by SIGPIPE, and marks
# NAME.trunc and NAME.wfail. Runs as a subshell of the supervisor.
# The subshell opens its read end as fd 5 before the call (it never blocks: the supervisor holds
# both ends) and keeps it open until the stream has been drained; the copiers read it through that
# descriptor.
pump() {
    _cap=$((LOG_CAP - ${3:-0}))
    [ "$_cap" -ge 0 ] || _cap=0
    _w=- _d=0 _wfail=
    if [ -n "$MASK" ]; then
        # The masker reads the pipe directly; the supervisor writes one newline after the task's
        # last byte, which with mask.awk's leading-newline output keeps the log byte-exact.
        # mawk stops at a failed write, busybox awk goes on; either way the meta file is missing.
        # An adopted pipe is not the supervisor's to write to: cat adds the newline instead.
        if [ -n "$ADOPT" ]; then
            {
                cat
                printf '\n'
            } <&5 | LC_ALL=C $AWK -v cap="$_cap" -v meta="$1.meta" -v trunc="$1.trunc" "$MASK_AWK" >>"$2" &
        else
            LC_ALL=C $AWK -v cap="$_cap" -v meta="$1.meta" -v trunc="$1.trunc" "$MASK_AWK" <&5 >>"$2" &
        fi
        _c=$!
        if wait "$_c" && [ -s "$1.meta" ]; then
            return 0
        fi
        _wfail=1
    else
        case $PLAIN in
        gnu)
            if [ -n "$PRELOAD" ]; then
                _STDBUF_O=0 LD_PRELOAD=$PRELOAD${LD_PRELOAD:+:$LD_PRELOAD} head -c "$_cap" <&5 >>"$2" &
            else
                stdbuf -o0 head -c "$_cap" <&5 >>"$2" &
            fi
            ;;
        bytes) dd bs=65536 iflag=count_bytes count="$_cap" <&5 >>"$2" 2>/dev/null &;;
        *) dd bs=1 count="$_cap" <&5 >>"$2" 2>/dev/null &;;
        esac
        _c=$!
        wait "$_c" || _wfail=1
    fi
    _more=
    if [ -z "$_wfail" ]; then
        # The copier stopped at the cap or at the end of the stream: one byte more tells which.
        dd bs=1 count=1 <&5 of=/dev/null 2>"$1.dd"
        _r=
        read -r _r _x <"$1.dd"
        case $_r in 1+0 | 0+1) _more=1 _d=1 ;; esac
        [ -n "$_more" ] && _w=$LOG_CAP
    fi
    if [ -n "$_more$_wfail" ]; then
        # A log filled to the cap says so before the truncation shows (NAME.full holds its size,
        # which readers then take without a process); a failed write shows first.
        if [ -n "$_wfail" ]; then : >"$1.wfail"; else printf '%s\n' "$((${3:-0} + _cap))" >"$1.full"; fi
        : >"$1.trunc"
        _rest=
        if [ "$PLAIN" = gnu ]; then
            # GNU dd reports what it copied.
            LC_ALL=C dd bs=1048576 <&5 of=/dev/null 2>"$1.dd"
            { read -r _x && read -r _x && read -r _rest _x; } <"$1.dd"
            case $_rest in '' | *[!0-9]*) _rest=0 ;; esac
        else
            _rest=$(wc -c <&5)
        fi
        _d=$((_d + _rest))
    fi
    printf '%s %s\n' "$_w" "$_d" >"$1.meta"
}

# start_pumps: decides how to copy (masking or not), then starts one pump per stream, each with
# its read end as fd 5 (in adopt mode a copy of the command's pipe on fd 7 or 8).
# (Redirections of a background child are made with `exec` inside it: on a function call the
# shell would keep saved copies of the old descriptors open for the call's whole life.)
start_pumps() {
    wants_mask && MASK=1
    pick_tools
    (
        if [ -n "$ADOPT" ]; then exec 5<&7; else exec 5<"$OUT_PIPE"; fi
        exec </dev/null >/dev/null 2>>supervisor.err 7>&- 8>&- 9>&-
        pump out stdout.log "$OUT_PRE"
    ) &
    P1=$!
    (
        if [ -n "$ADOPT" ]; then exec 5<&8; else exec 5<"$ERR_PIPE"; fi
        exec </dev/null >/dev/null 2>>supervisor.err 7>&- 8>&- 9>&-
        pump err stderr.log "$ERR_PRE"
    ) &
    P2=$!
    proc_stat "$P1" && P1S=$ST_START
    proc_stat "$P2" && P2S=$ST_START
}

# pumps_open: both pumps hold their read ends (or are gone): the supervisor may let go of its ends.
pumps_open() {
    { [ -e "/proc/$P1/fd/5" ] || ! alive "$P1" "$P1S"; } && { [ -e "/proc/$P2/fd/5" ] || ! alive "$P2" "$P2S"; }
}

# timer: TERM to the task's group at its deadline (T seconds, or LEFT in adopt mode), KILL after
# TERM_GRACE_CS. The supervisor ends it (TERM) when the task ends, at any moment, also while it
# is starting a sleep: the trap ends the sleep in progress (`_s`, set only while it is unreaped)
# and notes the TERM, which `nap` then sees. With WAIT it first writes start.sh's `@wait` line
# after WAIT seconds (start.sh may be gone: no SIGPIPE may stop the timer).
timer() {
    _stop='' _s=''
    trap '_stop=1; [ -z "$_s" ] || kill -s KILL "$_s" 2>/dev/null' TERM
    if [ "$WAIT" != 0 ]; then
        nap "$WAIT"
        trap '' PIPE
        printf '@wait\n' >&9
        exec 9>&-
        LEFT=$((T - WAIT))
    fi
    nap "${LEFT:-$T}"
    : >timed_out
    sig_task TERM "$TPID" "$TSTART" "$ID"
    nap "$((TERM_GRACE_CS / 100)).$((TERM_GRACE_CS / 10 % 10))$((TERM_GRACE_CS % 10))"
    sig_task KILL "$TPID" "$TSTART" "$ID"
}

# nap SECONDS: the timer's sleep; exits the timer when a TERM came before, during or right after
# it. A TERM while the sleep was being started is seen once its pid is known; a later one finds
# it in `_s` (the trap ends it, and the wait returns). `_s` is cleared as soon as the wait has
# reaped the sleep: only a TERM in that instant signals a pid already reaped (one just freed by
# our own child, which the kernel hands out again only after going round all the others).
nap() {
    [ -z "$_stop" ] || exit 0
    sleep "$1" &
    _s=$!
    if [ -n "$_stop" ]; then
        kill -s KILL "$_s" 2>/dev/null
        exit 0
    fi
    wait "$_s"
    _s=''
    [ -z "$_stop" ] || exit 0
}

# kill_escaped: descendants that left the group but kept the task's environment tag. Only
# processes of this user (whose environment can be read at all) started since the task (a
# descendant cannot be older), outside the supervisor's own group (its pumps and timer), are
# candidates: no other process's environment is read, and all candidates are read by one grep.
kill_escaped() {
    case $TSTART in '' | *[!0-9]*) return 0 ;; esac
    set --
    for _p in /proc/[0-9]*; do
        _q=${_p#/proc/}
        case $_q in "$$" | 1) continue ;; esac
        proc_stat "$_q" || continue
        [ "$ST_STATE" != Z ] && [ "$ST_PGID" != "$SUP_PID" ] && [ "$ST_START" -ge "$TSTART" ] && [ -O "$_p" ] &&
            set -- "$@" "$_p/environ"
    done
    [ $# -gt 0 ] || return 0
    environ_list "SANDBOX_MCP_TASK=$ID" "$@" >escaped.list
    while read -r _f; do
        _q=${_f#/proc/}
        _q=${_q%/environ}
        case $_q in '' | *[!0-9]* | 0 | 1 | "$$") continue ;; esac
        if proc_stat "$_q" && [ "$ST_STATE" != Z ] && kill -s KILL "$_q" 2>/dev/null; then
            ESCAPED=$((ESCAPED + 1))
        fi
    done <escaped.list
}

# kill_pumps: stops pumps stuck on a FIFO that something outside the task still holds: the pump
# subshells (verified by start time) and their descendants, each by its own pid.
kill_pumps() {
    _ks=" "
    alive "$P1" "$P1S" && _ks="$_ks$P1 "
    alive "$P2" "$P2S" && _ks="$_ks$P2 "
    for _round in 1 2 3; do
        for _p in /proc/[0-9]*; do
            _q=${_p#/proc/}
            proc_stat "$_q" || continue
            case $_ks in *" $_q "*) continue ;; esac
            case $_ks in *" $ST_PPID "*) _ks="$_ks$_q " ;; esac
        done
    done
    for _q in $_ks; do kill -s KILL "$_q" 2>/dev/null; done
}

# let_go: closes the supervisor's ends of the pipes (fds 7 and 8), once the pumps hold theirs (a
# pump that opened its FIFO after that would wait for a writer forever), after the masker's final
# newline when masking. (A pump killed from outside must not take the supervisor with it: no
# SIGPIPE for that newline; the task, started earlier, keeps the default.)
let_go() {
    _g=0
    until pumps_open; do
        _g=$((_g + 1))
        [ "$_g" -ge 1000 ] && break
        [ "$_g" -ge 200 ] && sleep 0.005
    done
    if [ -n "$MASK" ] && [ -z "$ADOPT" ]; then
        trap '' PIPE
        printf '\n' >&7
        printf '\n' >&8
        trap - PIPE
    fi
    exec 7>&- 8>&-
}

# pumps_done: both pump subshells have exited (zombies until reaped: they are our children).
pumps_done() {
    ! alive "$P1" "$P1S" && ! alive "$P2" "$P2S"
}

# finish: after the task's leader exited (status in RC): ends what is left of its group and its
# escapees, lets the pumps finish, and saves the final state.
finish() {
    # (The marker file `done` is quoted where shellcheck would take it for the keyword.)
    : >'done'
    [ -z "$HOLDER" ] || close_input
    # Without a masker's newline to write, the supervisor's ends of the pipes go at once (once
    # the pumps hold theirs, see below): the pumps then end as soon as the last writer has gone,
    # beside the scans that follow instead of after them.
    if [ -z "$MASK" ] || [ -n "$ADOPT" ]; then
        let_go
    fi
    # Leftover members of the task's group, also after a normal exit. Signal 0 to the group is a
    # one-syscall test; only when it finds someone does the /proc scan tell zombies from the living.
    if sig_group 0 "$TPID" && group_tagged "$TPID" "$ID"; then
        if [ -e cancel ] || [ -e timed_out ]; then sig_task KILL "$TPID" "$TSTART" "$ID"; else sig_task TERM "$TPID" "$TSTART" "$ID"; fi
        _g=0
        while group_tagged "$TPID" "$ID"; do
            _g=$((_g + 1))
            [ "$_g" -eq 20 ] && sig_task KILL "$TPID" "$TSTART" "$ID"
            [ "$_g" -ge 40 ] && break
            sleep 0.1
        done
    fi
    kill_escaped
    # The masker's final newline goes after the task's and its escapees' last bytes (see pump).
    if [ -n "$MASK" ] && [ -z "$ADOPT" ]; then
        let_go
    fi
    # The pumps usually end within a millisecond of the task: look without a process first,
    # then poll.
    _g=0
    while ! pumps_done; do
        _g=$((_g + 1))
        [ "$_g" -le 200 ] && continue
        [ "$_g" -eq 240 ] && kill_escaped
        if [ "$_g" -ge 280 ]; then
            # Something outside the task's reach still holds the pipes.
            kill_pumps
            ERR="output pipes were held open by a process outside the task; logs may be incomplete"
            break
        fi
        if [ "$_g" -le 220 ]; then sleep 0.005; else sleep 0.05; fi
    done
    OUT_TRUNC=0 ERR_TRUNC=0
    [ -e out.trunc ] && OUT_TRUNC=1
    [ -e err.trunc ] && ERR_TRUNC=1
    log_sizes
    OUT_BYTES=$E_os ERR_BYTES=$E_es
    if [ -e out.wfail ] || [ -e err.wfail ]; then
        ERR="${ERR:+$ERR; }writing the logs failed (is the sandbox's disk full?): they end early and are marked truncated"
    fi
    now
    FINISHED=$NOW
    if [ -e cancel ]; then
        save cancelled
    elif [ -e timed_out ]; then
        save timed_out
    else
        save exited
    fi
}

# An adoption's supervisor has supervise-adopt.sh at the next line (it ends there); a start's
# has nothing.
# @adopt
start_pumps
if [ -n "$RUNNING" ]; then
    (
        exec </dev/null >/dev/null 2>&1 7>&- 8>&-
        [ "$WAIT" != 0 ] || exec 9>&-
        timer
    ) &
    TMR=$!
fi
wait "$TPID"
RC=$?
[ -n "$TMR" ] && kill -s TERM "$TMR" 2>/dev/null
finish
if [ "$WAIT" != 0 ]; then
    trap '' PIPE
    printf '@over\n' >&9
fi
exec 9>&-
