# supervise-adopt.sh: supervise.sh's adopt mode, sent (at supervise.sh's `# @adopt` line) only in
# the supervisor program of an adoption, so that a start_task request does not carry it.
# Arguments: see the table in src/supervisor/mod.rs.

# adopt DIR TIMEOUT LEFT PGID OUT_PRE ERR_PRE STARTED_AT: supervises a command that runs already
# (a run_command promoted at --task-after; start.sh's adopt claimed DIR). Its pipes' read ends
# are fds 7 and 8, its group PGID; the logs hold OUT_PRE and ERR_PRE bytes captured before. The
# command is not this shell's child: its end is its leader leaving (or turning zombie), polled,
# and its exit code is the one its shell's EXIT trap, or the server that reaps it, writes into
# DIR/exit_code (none: the outcome is unknown, never a success).
adopt() {
    D=$1 T=$2 LEFT=$3 TPID=$4 OUT_PRE=$5 ERR_PRE=$6 STARTED=$7
    ID=${D##*/}
    exec 9>&1 >/dev/null
    cd "$D" || exit 1
    umask 077
    SUP_PID=$$
    proc_stat "$$" && SUP_START=$ST_START
    boot_id
    TSTART='' RC='' ERR='' FINISHED='' OUT_BYTES='' ESCAPED=0 MASK='' ADOPT=1
    if proc_stat "$TPID" && [ "$ST_PGID" = "$TPID" ]; then TSTART=$ST_START; fi
    save running
    printf 'running\n' >&9
    exec 9>&-
    start_pumps
    # Only the pumps hold the pipes now.
    exec 7<&- 8<&-
    (
        exec </dev/null >/dev/null 2>&1 9>&-
        timer
    ) &
    TMR=$!
    _i=0
    while [ ! -s exit_code ] && alive "$TPID" "$TSTART"; do
        _i=$((_i + 1))
        if [ "$_i" -le 100 ]; then sleep 0.1; else sleep 0.5; fi
    done
    # The trap writes the code just before its shell exits; the server writes it once it reaped
    # a command whose trap did not (give it a moment).
    _i=0
    while :; do
        RC=''
        [ -e exit_code ] && read -r RC _x <exit_code
        case $RC in '' | *[!0-9]*) RC='' ;; *) break ;; esac
        _i=$((_i + 1))
        [ "$_i" -ge 30 ] && break
        sleep 0.1
    done
    kill -s TERM "$TMR" 2>/dev/null
    [ -n "$RC" ] || ERR="its exit code was not observed (its EXIT trap was replaced, or a signal ended it, after its server was gone)"
    finish
}

if [ "$MODE" = adopt ]; then
    adopt "$@"
    exit 0
fi
