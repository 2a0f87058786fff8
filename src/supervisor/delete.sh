# delete.sh: removes a finished task's directory; refuses one that may still run. Arguments and
# preamble (CLAIM_FRESH_CS): see the table in src/supervisor/mod.rs.

exec 3>&2 2>/dev/null
task_root
D=$ROOT/$1
if [ ! -d "$D" ]; then
    printf '@none\n'
    exit 0
fi
emit_state "$D"
printf '@end\n'
case $S_status in
running | starting)
    if [ "$E_live" = 1 ] || [ "$E_group" = 1 ]; then
        printf '@refused\n'
        exit 0
    fi
    ;;
claimed)
    # A start in progress (its supervisor reports within seconds) is not deleted under it.
    uptime_cs
    case $S_claimed_cs in '' | *[!0-9]*) S_claimed_cs=$CS ;; esac
    # (An uptime below the claim means the sandbox rebooted: the start is long dead.)
    if [ "$CS" -ge "$S_claimed_cs" ] && [ $((CS - S_claimed_cs)) -lt "$CLAIM_FRESH_CS" ]; then
        printf '@refused\n'
        exit 0
    fi
    ;;
esac
rm -rf "$D" && printf '@deleted\n'
