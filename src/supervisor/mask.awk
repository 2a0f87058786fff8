# mask.awk: exact-value secret masking and byte capping of one output stream, by the rules of
# the masker of the server (src/mask.rs). Run with LC_ALL=C (byte semantics). This file must
# contain no single quote: the supervisor embeds it in a single-quoted shell string. The server
# puts a generated BEGIN before it that sets min_len, the shortest value masked.
#   -v check=1      exit 0 when the environment holds a secret to mask, 1 otherwise
#   -v cap=N        bytes to keep; the rest is counted in the meta file
#   -v meta=FILE    receives "written dropped" at the end
#   -v trunc=FILE   created when the first byte is dropped
# The caller appends one newline to the input, and each record but the first is written with
# its leading newline, so the output equals the input exactly (no added final newline).

function load(   k, n, i, parts, line) {
    ns = 0
    for (k in ENVIRON) {
        if (toupper(k) !~ /KEY|TOKEN|SECRET|PASSWORD/) continue
        n = split(ENVIRON[k], parts, "\n")
        for (i = 1; i <= n; i++) {
            line = parts[i]
            sub(/^[ \t\r]+/, "", line)
            sub(/[ \t\r]+$/, "", line)
            if (length(line) >= min_len && !(line in seen)) {
                seen[line] = 1
                sec[++ns] = line
                if (index(line, "*")) starred = 1
            }
        }
    }
}

# mask(s): every occurrence of every secret (overlaps included) is covered; each run of covered
# bytes becomes ***. A secret containing * can line up with the *** of a mask: mask again until
# no secret is left (each pass that finds one shortens the line, so this ends).
function mask(s) {
    if (!found(s)) return s
    s = mask1(s)
    if (starred) while (found(s)) s = mask1(s)
    return s
}

function found(s,   i) {
    for (i = 1; i <= ns; i++) if (index(s, sec[i])) return 1
    return 0
}

function mask1(s,   i, n, L, from, p, k, out, pos) {
    n = length(s)
    split("", cov)
    for (i = 1; i <= ns; i++) {
        L = length(sec[i])
        from = 1
        while (from <= n - L + 1) {
            p = index(substr(s, from), sec[i])
            if (!p) break
            p += from - 1
            for (k = p; k < p + L; k++) cov[k] = 1
            from = p + 1
        }
    }
    out = ""
    pos = 1
    while (pos <= n) {
        k = pos
        while (k <= n && !(k in cov)) k++
        out = out substr(s, pos, k - pos)
        if (k > n) break
        out = out "***"
        while (k <= n && (k in cov)) k++
        pos = k
    }
    return out
}

function emit(s,   n, room) {
    n = length(s)
    if (written + n <= cap) {
        printf "%s", s
        written += n
        fflush()
        return
    }
    room = cap - written
    if (room > 0) {
        printf "%s", substr(s, 1, room)
        written = cap
        fflush()
    } else room = 0
    dropped += n - room
    if (!flagged) flag()
}

# flag(): the first byte was dropped.
function flag() {
    flagged = 1
    printf "" > trunc
    close(trunc)
}

BEGIN {
    load()
    if (check) exit(ns > 0 ? 0 : 1)
    cap += 0
    written = 0
    dropped = 0
    first = 1
}

# Past the cap nothing is kept: the bytes are only counted, unmasked (the fast path that keeps
# a task writing far more than the cap from being slowed down by its masker).
written >= cap {
    dropped += length($0) + !first
    first = 0
    if (!flagged) flag()
    next
}

{
    line = ns ? mask($0) : $0
    if (first) {
        first = 0
        emit(line)
    } else emit("\n" line)
}

END {
    if (check) exit(ns > 0 ? 0 : 1)
    printf "%.0f %.0f\n", written, dropped > meta
    close(meta)
}
