# supervise.sh: the detached supervisor of one task, and its output pumps.
# The server prepends MASK_AWK='...' (the masker program), the preamble (LOG_CAP,
# TERM_GRACE_CS) and common.sh; start.sh runs it fully detached. Arguments: see the table in
# src/supervisor/mod.rs.
# It writes DIR/state only through `save` (temp file + rename). Every fork on the way to
# `running` delays the task, so that path uses builtins wherever it can.

save() {
    # One line per value: an error that quotes user input (a cwd) must not forge other keys.
    case $ERR in *"
"*) ERR=$(printf '%s' "$ERR" | tr '\n' ' ') ;; esac
    # Temp file + rename. When the temp file cannot be written (a full disk), the state file is
    # rewritten in place, in the space it already holds: better than losing an observed outcome,
    # at the cost of a moment in which a reader finds it empty (and says unknown).
    if ! state_lines "$1" >state.tmp || ! mv -f state.tmp state; then
        rm -f state.tmp
        state_lines "$1" >state
    fi
}

# state_lines STATUS: the state file's content; fails when any write fails.
state_lines() {
    printf 'status=%s\nboot_id=%s\nsup_pid=%s\nsup_start=%s\npgid=%s\ntask_start=%s\ntimeout=%s\nstarted_at=%s\n' \
        "$1" "$BOOT" "$SUP_PID" "$SUP_START" "$TPID" "$TSTART" "$T" "$STARTED" &&
        printf 'finished_at=%s\nexit_code=%s\nerror=%s\nescaped=%s\n' "$FINISHED" "$RC" "$ERR" "$ESCAPED" &&
        if [ -n "$OUT_BYTES" ]; then
            printf 'out_bytes=%s\nerr_bytes=%s\nout_truncated=%s\nerr_truncated=%s\n' "$OUT_BYTES" "$ERR_BYTES" "$OUT_TRUNC" "$ERR_TRUNC"
        fi
}

# pump NAME FIFO LOG: copies the task's stream into LOG, at most LOG_CAP bytes, draining and counting
# the rest; writes NAME.meta ("written dropped"), then NAME.done, at the end, and NAME.trunc at
# the first dropped byte. When writing LOG fails (a full disk) it still drains the stream, so
# that the task is neither blocked nor killed by SIGPIPE, and marks NAME.trunc and NAME.wfail.
# Runs as a subshell of the supervisor; opens its FIFO first (the supervisor waits for that),
# then decides how to copy.
pump() {
    exec 5<"$2"
    if LC_ALL=C awk -v check=1 "$MASK_AWK" </dev/null 2>/dev/null; then
        _awk='awk'
        case $(awk -W version </dev/null 2>&1) in *mawk*) _awk="awk -W interactive" ;; esac
        # The appended newline and mask.awk's leading-newline output keep the log byte-exact.
        # mawk stops at a failed write, busybox awk goes on; either way the meta file is missing.
        if ! { cat <&5; echo; } | LC_ALL=C $_awk -v cap="$LOG_CAP" -v meta="$1.meta" -v trunc="$1.trunc" "$MASK_AWK" >>"$3" ||
            [ ! -s "$1.meta" ]; then
            : >"$1.trunc"
            : >"$1.wfail"
            cat <&5 >/dev/null
        fi
        : >"$1.done"
        return
    fi
    exec 6>>"$3"
    # GNU dd reads once per run and prints the byte count; busybox dd has an exact count_bytes.
    # The answer is kept per user, so only the first task asks.
    if [ -e ../.dd-gnu ]; then
        _dd=gnu
    elif [ -e ../.dd-bytes ]; then
        _dd=bytes
    else
        case $(dd --version 2>/dev/null) in
        *coreutils*) _dd=gnu ;;
        *) if dd bs=1 count=1 iflag=count_bytes </dev/null >/dev/null 2>&1; then _dd=bytes; else _dd=slow; fi ;;
        esac
        : >"../.dd-$_dd"
    fi
    _w=0
    _left=$LOG_CAP
    _wfail=
    if [ "$_dd" = gnu ]; then
        _small=0
        while [ "$_left" -gt 0 ]; do
            # One read of what the pipe holds, written at once: partial lines show immediately.
            # (GNU dd fails when it cannot write the data, or its count: a full disk either way.)
            if ! LC_ALL=C dd bs="$_left" count=1 <&5 >&6 2>"$1.dd"; then
                _wfail=1
                break
            fi
            _n=
            { read -r _x && read -r _x && read -r _n _x; } <"$1.dd"
            case $_n in '' | *[!0-9]*) break ;; esac
            [ "$_n" -eq 0 ] && break
            _left=$((_left - _n))
            _w=$((_w + _n))
            # A trickle of small writes: let it pool instead of spawning one dd per write.
            if [ "$_n" -lt 4096 ]; then
                _small=$((_small + 1))
                [ "$_small" -ge 2 ] && sleep 0.01
            else
                _small=0
            fi
        done
        if [ -n "$_wfail" ]; then
            _w=$(wc -c <"$3")
        elif [ "$_n" != 0 ] && [ "$_left" -gt 0 ]; then
            _dd=slow # the count was unreadable: finish exactly, byte by byte
        fi
    fi
    if [ "$_dd" != gnu ]; then
        if [ "$_dd" = bytes ]; then
            dd bs=65536 iflag=count_bytes count="$_left" <&5 >&6 2>/dev/null || _wfail=1
        else
            dd bs=1 count="$_left" <&5 >&6 2>/dev/null || _wfail=1
        fi
        _w=$(wc -c <"$3")
    fi
    exec 6>&-
    _d=0
    if [ "$_w" -ge "$LOG_CAP" ] || [ -n "$_wfail" ]; then
        _one=$(dd bs=1 count=1 <&5 2>/dev/null | wc -c)
        if [ "$_one" -gt 0 ] || [ -n "$_wfail" ]; then
            : >"$1.trunc"
            [ -n "$_wfail" ] && : >"$1.wfail"
            _rest=
            if [ "$_dd" = gnu ] && [ "$_one" -gt 0 ]; then
                # Large reads drain a fast writer quicker than wc; GNU dd reports the count.
                LC_ALL=C dd bs=1048576 <&5 of=/dev/null 2>"$1.dd"
                { read -r _x && read -r _x && read -r _rest _x; } <"$1.dd"
            fi
            case $_rest in '' | *[!0-9]*) _rest=$(wc -c <&5) ;; esac
            _d=$((_one + _rest))
        fi
    fi
    printf '%s %s\n' "$_w" "$_d" >"$1.meta"
    : >"$1.done"
}

# timer: TERM at the deadline, KILL after TERM_GRACE_CS; exits once `done` exists.
# (The marker file `done` is quoted where shellcheck would take it for the keyword.)
timer() {
    read -r _up _x </proc/uptime
    _end=$((${_up%.*} + T))
    while :; do
        [ -e 'done' ] && return 0
        read -r _up _x </proc/uptime
        [ "${_up%.*}" -ge "$_end" ] && break
        sleep 1
    done
    [ -e 'done' ] && return 0
    : >timed_out
    sig_task TERM "$TPID" "$TSTART" "$ID"
    _g=0
    while [ "$_g" -lt $((TERM_GRACE_CS / 10)) ]; do
        sleep 0.1
        [ -e 'done' ] && return 0
        _g=$((_g + 1))
    done
    sig_task KILL "$TPID" "$TSTART" "$ID"
}

# kill_escaped: descendants that left the group but kept the task's environment tag.
kill_escaped() {
    command -v grep >/dev/null 2>&1 || return 0
    # The names are /proc/PID/environ: no spaces, so a word list is exact.
    # shellcheck disable=SC2013
    for _f in $(grep -l -a -F "SANDBOX_MCP_TASK=$ID" /proc/[0-9]*/environ 2>/dev/null); do
        _p=${_f#/proc/}
        _p=${_p%/environ}
        case $_p in '' | *[!0-9]* | 0 | 1 | "$$") continue ;; esac
        if proc_stat "$_p" && [ "$ST_STATE" != Z ] && kill -s KILL "$_p" 2>/dev/null; then
            ESCAPED=$((ESCAPED + 1))
        fi
    done
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

# pump_meta NAME: sets _pw _pd _pt from NAME.meta, falling back to the log size.
pump_meta() {
    _pw='' _pd=0 _pt=0
    [ -e "$1.done" ] && read -r _pw _pd <"$1.meta"
    [ -e "$1.trunc" ] && _pt=1
    if [ -z "$_pw" ]; then
        if [ "$1" = out ]; then _pw=$(wc -c <stdout.log); else _pw=$(wc -c <stderr.log); fi
    fi
}

# give_up STATUS [ERROR]: a final state before the task ran.
give_up() {
    exec 7>&- 8>&-
    ERR=${2-}
    now
    FINISHED=$NOW
    save "$1"
    exit 0
}

supervise() {
    D=$1 T=$2 TSH=$3 CWD=$4 CMD=$5
    ID=${D##*/}
    cd "$D" || exit 1
    umask 077
    SUP_PID=$$
    proc_stat "$$" && SUP_START=$ST_START
    boot_id
    now
    STARTED=$NOW
    TPID='' TSTART='' RC='' ERR='' FINISHED='' OUT_BYTES='' ESCAPED=0
    # The task shell (for example /bin/bash -l) falls back to /bin/sh where it does not exist.
    set -f
    # The task shell is a program and its flags: split on purpose (globbing is off).
    # shellcheck disable=SC2086
    set -- $TSH
    set +f
    [ -x "$1" ] || TSH=/bin/sh
    if ! mkfifo out.fifo err.fifo 2>>supervisor.err; then
        give_up failed_to_start "mkfifo failed: the sandbox needs mkfifo and a filesystem that supports FIFOs"
    fi
    # Pumps first: opening a FIFO blocks until both ends are open.
    pump out out.fifo stdout.log </dev/null >/dev/null 2>>supervisor.err &
    P1=$!
    pump err err.fifo stderr.log </dev/null >/dev/null 2>>supervisor.err &
    P2=$!
    exec 7>out.fifo 8>err.fifo
    proc_stat "$P1" && P1S=$ST_START
    proc_stat "$P2" && P2S=$ST_START
    [ -e cancel ] && give_up cancelled
    cd "$CWD" 2>/dev/null || give_up failed_to_start "cwd $CWD no longer exists"
    set -f
    # shellcheck disable=SC2086 # the task shell and its flags, split as above
    SANDBOX_MCP_TASK=$ID setsid $TSH -c "$CMD" </dev/null >&7 2>&8 7>&- 8>&- &
    TPID=$!
    set +f
    exec 7>&- 8>&-
    cd "$D" || exit 1
    # The child calls setsid() only after the fork: until /proc shows pgid == pid, a group signal
    # would reach nobody. Confirm before publishing `running` or arming the timer.
    _i=0
    while proc_stat "$TPID" && [ "$ST_PGID" != "$TPID" ] && [ "$ST_STATE" != Z ]; do
        _i=$((_i + 1))
        [ "$_i" -ge 500 ] && break
        [ "$_i" -ge 50 ] && sleep 0.01
    done
    if proc_stat "$TPID" && [ "$ST_PGID" = "$TPID" ]; then TSTART=$ST_START; fi
    save running
    timer </dev/null >/dev/null 2>&1 &
    wait "$TPID"
    RC=$?
    : >'done'
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
    _g=0
    while [ ! -e out.done ] || [ ! -e err.done ]; do
        _g=$((_g + 1))
        [ "$_g" -eq 40 ] && kill_escaped
        if [ "$_g" -ge 80 ]; then
            # Something outside the task's reach still holds the pipes.
            kill_pumps
            ERR="output pipes were held open by a process outside the task; logs may be incomplete"
            break
        fi
        # The pumps usually finish within milliseconds of the task: poll fast, then slower.
        if [ "$_g" -le 20 ]; then sleep 0.005; else sleep 0.05; fi
    done
    pump_meta out
    OUT_BYTES=$_pw OUT_TRUNC=$_pt
    pump_meta err
    ERR_BYTES=$_pw ERR_TRUNC=$_pt
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

case $1 in
supervise)
    shift
    supervise "$@"
    ;;
esac
