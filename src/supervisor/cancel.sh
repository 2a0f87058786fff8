# cancel.sh: asks a running task to stop (TERM to its own group, KILL after 1.5 s), waits at most
# 3 s for the supervisor's final state, then prints the snapshot. common.sh is prepended.
#   SH -c SCRIPT sh ID OUT_OFFSET ERR_OFFSET LIMIT

exec 3>&2 2>/dev/null
task_root
D=$ROOT/$1
if [ ! -d "$D" ]; then
    printf '@none\n'
    exit 0
fi
if read_state "$D" && ! is_final; then
    : >"$D/cancel"
    _i=0 _sent=
    while [ "$_i" -lt 60 ]; do
        read_state "$D" && is_final && break
        if [ -z "$_sent" ] && [ -n "$S_pgid" ]; then
            sig_task TERM "$S_pgid" "$S_task_start"
            _sent=1
        fi
        [ "$_i" -eq 30 ] && sig_task KILL "$S_pgid" "$S_task_start"
        _i=$((_i + 1))
        sleep 0.05
    done
fi
emit "$D" "$2" "$3" "$4"
