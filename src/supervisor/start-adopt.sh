# start-adopt.sh: start.sh's adopt mode, sent (at start.sh's `# @adopt` line) only in the
# program of an adoption, so that a start_task request does not carry it. Arguments: see the
# table in src/supervisor/mod.rs.

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
    D=$ROOT/$ID
    command -v setsid >/dev/null || {
        printf '@error nosetsid the sandbox has no setsid command, which background tasks need\n'
        rm -f "$ROOT/.adopt-$ID".*
        return
    }
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

if [ "$1" = adopt ]; then
    shift
    adopt "$@"
    exit 0
fi
