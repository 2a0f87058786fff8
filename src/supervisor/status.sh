# status.sh: prints one task's snapshot with a page of each log. Arguments: see the table in
# src/supervisor/mod.rs.

exec 3>&2 2>/dev/null
task_root
if [ -d "$ROOT/$1" ]; then
    emit "$ROOT/$1" "$2" "$3" "$4"
else
    printf '@none\n'
fi
