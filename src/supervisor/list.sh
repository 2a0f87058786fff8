# list.sh: prints the state of every task of this OS user. No arguments.

exec 3>&2 2>/dev/null
task_root
for _d in "$ROOT"/*/; do
    [ -d "$_d" ] || continue
    emit_state "${_d%/}"
    # The command's start (list_tasks shows 200 characters of it), in hex: any bytes fit one line.
    # A regular file only (a FIFO there would hold the listing until its budget).
    printf 'cmd_hex=%s\n' "$(regular "${_d}cmd" && head -c 800 "${_d}cmd" 2>/dev/null | od -An -v -tx1 | tr -d ' \n')"
    printf '@end\n'
done
printf '@done\n'
