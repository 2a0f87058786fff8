# status.sh: prints one task's snapshot with a page of each log. common.sh is prepended.
#   SH -c SCRIPT sh ID OUT_OFFSET ERR_OFFSET LIMIT

exec 3>&2 2>/dev/null
task_root
if [ -d "$ROOT/$1" ]; then
    emit "$ROOT/$1" "$2" "$3" "$4"
else
    printf '@none\n'
fi
