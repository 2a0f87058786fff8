# input.sh: send_input where the server cannot write a task's input itself (E2B): writes DATA
# (in printf %b form: the server doubles backslashes and writes NUL as \0000) to task ID's input
# FIFO, then closes the input when EOF is 1. Arguments: see the table in src/supervisor/mod.rs.
# Answers `@written`, `@none` (no such task), `@missing` (a task without input), `@closed`,
# `@full` (the write did not finish within INPUT_WAIT_S: the task is not reading),
# `@tampered WHAT` (`stdin`) or `@tampered-eof WHAT` (`stdin.eof`; both before any byte went in),
# or `@written-open` (DATA went in, but the input could not be closed). Every write that can
# block runs under `timeout`: this shell never hangs.

exec 3>&2 2>/dev/null
task_root
D=$ROOT/$1
F=$D/stdin
# (Single quotes on purpose in both timeouts below: the $ are the inner shell's.)
# shellcheck disable=SC2016
if [ -L "$D" ]; then
    printf '@tampered the task directory is a symbolic link\n'
elif ! [ -d "$D" ]; then
    printf '@none\n'
elif [ -e "$D/stdin.closed" ]; then
    printf '@closed\n'
elif [ -L "$F" ]; then
    printf '@tampered a symbolic link\n'
elif ! [ -e "$F" ]; then
    printf '@missing\n'
elif [ -d "$F" ]; then
    printf '@tampered a directory\n'
elif ! [ -p "$F" ]; then
    printf '@tampered not a FIFO\n'
elif [ "$2" = 1 ] && { [ -L "$D/stdin.eof" ] || ! [ -p "$D/stdin.eof" ]; }; then
    printf '@tampered-eof not a FIFO\n'
elif [ -n "$3" ] && ! timeout "$INPUT_WAIT_S" sh -c 'printf "%b" "$1" >"$2"' sh "$3" "$F"; then
    printf '@full\n'
elif [ "$2" = 1 ] && ! timeout 1 sh -c ': >"$1"' sh "$D/stdin.eof"; then
    if [ -n "$3" ]; then printf '@written-open\n'; else printf '@closed\n'; fi
else
    printf '@written\n'
fi
