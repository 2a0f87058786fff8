# cancel.sh: asks a running task to stop (TERM to its own group, KILL after CANCEL_KILL_CS), waits
# at most CANCEL_WAIT_CS for the supervisor's final state, then prints the snapshot. Arguments and
# preamble: see the table in src/supervisor/mod.rs.

exec 3>&2 2>/dev/null
# The cancel marker is task state like any other: private to the sandbox user.
umask 077
task_root
D=$ROOT/$1
if [ ! -d "$D" ]; then
    printf '@none\n'
    exit 0
fi
if read_state "$D" && ! is_final; then
    : >"$D/cancel"
    # Time from /proc/uptime in hundredths of a second: a busy machine slows the loop, not the clock.
    uptime_cs
    _end=$((CS + CANCEL_WAIT_CS)) _kill=$((CS + CANCEL_KILL_CS)) _sent='' _killed='' _i=0
    while [ "$CS" -lt "$_end" ]; do
        read_state "$D" && is_final && break
        if [ -z "$_sent" ] && [ -n "$S_pgid" ]; then
            sig_task TERM "$S_pgid" "$S_task_start" "$1"
            _sent=1
        fi
        if [ -z "$_killed" ] && [ "$CS" -ge "$_kill" ]; then
            sig_task KILL "$S_pgid" "$S_task_start" "$1"
            _killed=1
        fi
        # A task that obeys TERM usually ends, and its supervisor saves the end, within a few
        # milliseconds: look again without starting a process first, then poll.
        _i=$((_i + 1))
        if [ "$_i" -gt 150 ]; then
            sleep 0.05
        elif [ "$_i" -gt 100 ]; then
            sleep 0.01
        fi
        uptime_cs
    done
fi
emit "$D" "$2" "$3" "$4"
