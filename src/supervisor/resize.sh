# resize.sh: sets the size of a pty task's terminal. Arguments: see the table in
# src/supervisor/mod.rs. Answers `@resized`, `@none` (no such task), `@over STATUS` (it has
# ended), `@nopty` (it has no terminal), `@notyet` (its terminal is not recorded yet) or
# `@error MESSAGE`.
# The terminal is the one the task directory's `pty` names (written by the task's wrapper, so by
# the sandbox: hostile input): it is used only when it is a /dev/pts device, the controlling
# terminal of the recorded process, which leads its own session and carries the task's tag.

exec 3>&2 2>/dev/null
task_root
D=$ROOT/$1
if ! [ -d "$D" ]; then
    printf '@none\n'
    exit 0
fi
read_state "$D"
if is_final; then
    printf '@over %s\n' "$S_status"
    exit 0
fi
_in=''
[ -f "$D/input" ] && ! [ -L "$D/input" ] && read -r _in _x <"$D/input"
case $_in in pty) ;; *)
    printf '@nopty\n'
    exit 0
    ;;
esac
_p='' _t=''
if ! [ -f "$D/pty" ] || [ -L "$D/pty" ] || ! read -r _p _t _x <"$D/pty"; then
    printf '@notyet\n'
    exit 0
fi
_n=${_t#/dev/pts/}
case $_p in '' | *[!0-9]* | 0 | 1) _n='' ;; esac
case $_t in /dev/pts/[0-9]*) ;; *) _n='' ;; esac
case $_n in *[!0-9]* | ??????*) _n='' ;; esac
if [ -z "$_n" ] || ! proc_stat "$_p" || [ "$ST_SID" != "$_p" ] || [ "$ST_TTY" != $((((136 + _n / 256) << 8) | (_n % 256))) ] ||
    ! [ -O "/proc/$_p" ] || ! [ -c "$_t" ] || ! environ_has "SANDBOX_MCP_TASK=$1" "/proc/$_p/environ"; then
    printf '@error the terminal recorded for this task is not the one its process holds (the task may have left its terminal or changed its environment)\n'
    exit 0
fi
if stty rows "$2" cols "$3" <"$_t"; then
    printf '@resized\n'
else
    printf '@error stty could not set the size of %s\n' "$_t"
fi
