# list.sh: prints the state of every task of this OS user. No arguments.

exec 3>&2 2>/dev/null
task_root
for _d in "$ROOT"/*/; do
    [ -d "$_d" ] || continue
    emit_state "${_d%/}"
    printf '@end\n'
done
printf '@done\n'
