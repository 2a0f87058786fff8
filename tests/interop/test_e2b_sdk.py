"""E2B's official Python SDK (`pip install e2b`) drives the e2b-emulator, proving it faithful.

Whatever the SDK accepts from the emulator it accepts from E2B, so every shape the SDK parses
(create/connect/info/list bodies, stream frames, end events, error bodies, /files answers) is
checked here. If the SDK and the emulator disagree, the emulator is wrong.

Run by tests/interop/run.sh with E2B_EMULATOR_URL set to a running emulator; alternatively set
E2B_EMULATOR_BIN and the script starts (and stops) one itself. Exits non-zero on any failure.
"""

import io
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from datetime import datetime, timedelta, timezone

EMULATOR = os.environ.get("E2B_EMULATOR_URL")
_proc = None
if not EMULATOR:
    _proc = subprocess.Popen(
        [os.environ["E2B_EMULATOR_BIN"], "--listen", "127.0.0.1:0"], stderr=subprocess.PIPE, text=True
    )
    line = _proc.stderr.readline()
    assert line.startswith("listening on http://"), line
    EMULATOR = line.split("listening on ", 1)[1].strip()
    # Keep draining its log so that it never blocks on a full pipe.
    threading.Thread(target=lambda: [sys.stderr.write(f"emulator: {x}") for x in _proc.stderr], daemon=True).start()

# The SDK reads these when a call is made; set them before it is imported.
os.environ.update(
    E2B_API_URL=EMULATOR,
    E2B_SANDBOX_URL=EMULATOR,
    E2B_API_KEY="e2b_0000000000000000000000000000000000000000",
)
os.environ.pop("E2B_DEBUG", None)

from e2b import (  # noqa: E402
    CommandExitException,
    InvalidArgumentException,
    NotFoundException,
    Sandbox,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxUnreachableException,
    TimeoutException,
)
from e2b.exceptions import SandboxNotFoundException  # noqa: E402


def test_api(method: str, path: str, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{EMULATOR}/_emulator/{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as r:
        raw = r.read()
    return json.loads(raw) if raw else None


def ok(what: str) -> None:
    print(f"ok: {what}")


def wait_for(cond, what: str, seconds: float = 10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def check_create_and_info(sbx: Sandbox) -> None:
    sid = sbx.sandbox_id
    assert len(sid) >= 16 and sid.isalnum() and sid.islower() and not sid.startswith("local-"), sid
    info = sbx.get_info()
    assert info.sandbox_id == sid and info.template_id == "base", info
    assert info.metadata == {"suite": "e2b-interop", "k": "v"}, info.metadata
    assert info.state.value == "running", info.state
    assert info.envd_version == "0.6.13" and info.cpu_count >= 1 and info.memory_mb >= 1, info
    left = info.end_at - datetime.now(timezone.utc)
    assert timedelta(seconds=100) < left <= timedelta(seconds=121), left
    assert sbx.is_running()
    listed = Sandbox.list(query=SandboxQuery(metadata={"suite": "e2b-interop"})).next_items()
    assert sid in [s.sandbox_id for s in listed], listed
    ok("Sandbox.create with envs and metadata; get_info; Sandbox.list by metadata; is_running")


def check_foreground(sbx: Sandbox) -> str:
    r = sbx.commands.run('echo "out $FOO $BAR $E2B_SANDBOX"; echo err >&2; pwd', envs={"BAR": "call"})
    lines = r.stdout.splitlines()
    assert r.exit_code == 0 and r.error is None, r
    assert lines[0] == "out create call true", r.stdout
    assert r.stderr == "err\n", r.stderr
    home = lines[1]
    sbx.files.make_dir("sub/dir")
    r = sbx.commands.run("pwd", cwd="sub/dir")
    assert r.stdout == f"{home}/sub/dir\n", (r.stdout, home)
    try:
        sbx.commands.run("echo partial; echo bad >&2; exit 3")
        raise AssertionError("a non-zero exit did not raise")
    except CommandExitException as e:
        assert e.exit_code == 3 and e.stdout == "partial\n" and e.stderr == "bad\n", e
        assert e.error == "exit status 3", e.error
    try:
        sbx.commands.run("true", cwd="/no/such/dir")
        raise AssertionError("a missing cwd did not raise")
    except InvalidArgumentException as e:
        assert "does not exist" in str(e), e
    big = sbx.commands.run("head -c 300000 /dev/zero | tr '\\0' x")
    assert big.stdout == "x" * 300000, len(big.stdout)
    ok("commands.run foreground: stdout, stderr, exit codes, envs, cwd, CommandExitException, 300 kB output")
    return home


def check_background(sbx: Sandbox) -> None:
    script = "echo before; touch started; while [ ! -e go ]; do sleep 0.05; done; echo after"
    h = sbx.commands.run(script, background=True, timeout=0)
    assert h.pid > 1
    running = {p.pid: p for p in sbx.commands.list()}
    assert h.pid in running and running[h.pid].cmd == "/bin/bash", running
    wait_for(lambda: sbx.files.exists("started"), "the command to print its first line")  # before connecting
    attached = sbx.commands.connect(h.pid, timeout=0)
    assert attached.pid == h.pid
    sbx.files.write("go", "")
    res = attached.wait()
    assert res.exit_code == 0 and res.stdout == "after\n", res  # no replay of "before"
    first = h.wait()
    assert first.stdout == "before\nafter\n", first
    # The end event is kept for a while: a late connect gets start + end at once.
    late = sbx.commands.connect(h.pid).wait()
    assert late.exit_code == 0 and late.stdout == "", late
    try:
        sbx.commands.connect(4_000_000)
        raise AssertionError("connect to an unknown pid did not raise")
    except NotFoundException:
        pass
    ok("commands.run(background=True), commands.list, commands.connect(pid) without replay, late connect, unknown pid")


def check_kill_and_stdin(sbx: Sandbox) -> None:
    h = sbx.commands.run("sleep 30", background=True)
    assert sbx.commands.kill(h.pid) is True
    try:
        h.wait()
        raise AssertionError("a killed command did not raise")
    except CommandExitException as e:
        assert e.exit_code == -1 and e.error == "signal: killed", (e.exit_code, e.error)
    assert sbx.commands.kill(h.pid) is False
    assert h.pid not in [p.pid for p in sbx.commands.list()]
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hello\n")
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "hello\n"
    ok("commands.kill (True, then False), end event of a SIGKILL, send_stdin/close_stdin")


def check_command_timeout(sbx: Sandbox) -> None:
    started = time.monotonic()
    try:
        sbx.commands.run("sleep 20; echo never", timeout=1)
        raise AssertionError("the command timeout did not fire")
    except TimeoutException:
        pass
    assert time.monotonic() - started < 10
    # envd kills the process when Connect-Timeout-Ms elapses.
    wait_for(
        lambda: not any("sleep 20" in " ".join(p.args) for p in sbx.commands.list()), "the timed-out command to be killed"
    )
    ok("commands.run timeout: TimeoutException and the process killed")


def check_files(sbx: Sandbox, home: str) -> None:
    info = sbx.files.write("dir/sub/a.txt", "content")
    assert info.path == f"{home}/dir/sub/a.txt" and info.name == "a.txt", info
    assert sbx.files.read("dir/sub/a.txt") == "content"
    binary = bytes(range(256)) * 64
    sbx.files.write(f"{home}/dir/b.bin", binary)
    assert bytes(sbx.files.read("dir/b.bin", format="bytes")) == binary
    streamed = sbx.files.write("streamed/c.bin", io.BytesIO(binary))  # file-like: octet-stream upload
    assert streamed.path == f"{home}/streamed/c.bin", streamed
    assert bytes(sbx.files.read("streamed/c.bin", format="bytes")) == binary
    entries = {e.name: e for e in sbx.files.list("dir")}
    assert set(entries) == {"sub", "b.bin"}, entries
    assert entries["b.bin"].type.value == "file" and entries["b.bin"].size == len(binary), entries["b.bin"]
    assert entries["sub"].type.value == "dir", entries["sub"]
    assert entries["b.bin"].permissions.startswith("-rw") and entries["b.bin"].modified_time.year >= 2024
    deep = [e.path for e in sbx.files.list("dir", depth=2)]
    assert f"{home}/dir/sub/a.txt" in deep, deep
    assert sbx.files.exists("dir/sub/a.txt") and not sbx.files.exists("nope")
    assert sbx.files.get_info("dir/sub/a.txt").size == 7
    assert sbx.files.make_dir("newdir") is True and sbx.files.make_dir("newdir") is False
    sbx.files.rename("dir/sub/a.txt", "moved/a.txt")
    assert sbx.files.read("moved/a.txt") == "content"
    sbx.files.remove("moved")
    assert not sbx.files.exists("moved/a.txt")
    try:
        sbx.files.read("does/not/exist")
        raise AssertionError("reading a missing file did not raise")
    except NotFoundException as e:
        assert "does not exist" in str(e), e
    # What commands write, the file API reads, and the reverse.
    sbx.commands.run("printf from-command > cmd.txt")
    assert sbx.files.read("cmd.txt") == "from-command"
    assert sbx.commands.run("cat dir/b.bin | wc -c").stdout.strip() == str(len(binary))
    ok("files.write (multipart, octet-stream, nested, absolute), read (text, bytes), list (depth 1, 2), exists, get_info, make_dir, rename, remove")


def check_timeouts_and_connect(sbx: Sandbox) -> None:
    sbx.set_timeout(3600)
    end1 = sbx.get_info().end_at
    sbx.set_timeout(100)
    end2 = sbx.get_info().end_at
    assert end2 < end1 - timedelta(seconds=3000), (end1, end2)
    again = Sandbox.connect(sbx.sandbox_id)  # default 300 s: extends a shorter TTL
    end3 = again.get_info().end_at
    assert end3 >= end2 + timedelta(seconds=190), (end2, end3)
    sbx.set_timeout(1000)
    end4 = sbx.get_info().end_at
    Sandbox.connect(sbx.sandbox_id, timeout=10)  # never shortens
    assert sbx.get_info().end_at == end4
    assert again.commands.run("echo via-connect").stdout == "via-connect\n"
    ok("set_timeout (extend and shorten), Sandbox.connect (only extends), commands through the connected object")


def check_pause_resume(sbx: Sandbox) -> None:
    h = sbx.commands.run("for i in $(seq 100); do sleep 0.1; done; echo survived", background=True, timeout=0)
    assert sbx.pause() is True
    assert sbx.get_info().state.value == "paused"
    assert not sbx.is_running()
    assert sbx.pause() is False  # already paused: 409
    try:
        h.wait()
        raise AssertionError("a stream survived the pause")
    except SandboxNotRunningException as e:
        assert "ended before the stream completed" in str(e), e
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert resumed.is_running() and resumed.get_info().state.value == "running"
    assert h.pid in [p.pid for p in resumed.commands.list()], "the process did not survive pause/resume"
    assert resumed.commands.connect(h.pid, timeout=0).wait().stdout == "survived\n"
    ok("pause (True, then False), paused state, streams end with the proxy's error, connect resumes, processes survive")


def check_faults(sbx: Sandbox) -> None:
    test_api("DELETE", "requests")
    test_api("POST", "faults", {"path_prefix": f"/sandboxes/{sbx.sandbox_id}", "method": "GET", "status": 503, "count": 1})
    assert sbx.get_info().sandbox_id == sbx.sandbox_id  # the SDK retries 503
    counts = test_api("GET", "requests")
    assert counts["routes"]["GET /sandboxes/{id}"] == 2, counts
    test_api("POST", "faults", {"path_prefix": "/process.Process/Start", "drop_after_bytes": 0})
    try:
        sbx.commands.run("touch ran-anyway; sleep 1")
        raise AssertionError("a dropped stream did not raise")
    except SandboxUnreachableException as e:  # a transport failure, and /health says it runs
        assert "chunk" in str(e), e
    wait_for(lambda: sbx.files.exists("ran-anyway"), "the command whose answer was dropped to run")
    # 45 bytes: the whole start frame (at most 40 bytes), then the cut inside the next one.
    test_api("POST", "faults", {"path_prefix": "/process.Process/Start", "drop_after_bytes": 45})
    try:
        sbx.commands.run("echo cut-after-start")
        raise AssertionError("a stream cut after its start frame did not raise")
    except SandboxUnreachableException:
        pass
    assert test_api("GET", "faults") == []
    ok("faults: status 503 (retried by the SDK), drop_after_bytes on Start (command still ran); request counts")


def check_kill(sbx: Sandbox) -> None:
    assert sbx.kill() is True
    assert sbx.kill() is False
    assert not sbx.is_running()
    try:
        sbx.commands.run("echo x")
        raise AssertionError("a command ran in a killed sandbox")
    except SandboxNotRunningException:
        pass
    try:
        Sandbox.connect(sbx.sandbox_id)
        raise AssertionError("connect to a killed sandbox did not raise")
    except SandboxNotFoundException:
        pass
    ok("kill (True, then False), is_running False, SandboxNotRunningException, connect raises SandboxNotFoundException")


def check_expiry() -> None:
    sbx = Sandbox.create(timeout=2)
    h = sbx.commands.run("sleep 60", background=True, timeout=0)
    try:
        h.wait()
        raise AssertionError("the stream outlived the sandbox")
    except SandboxNotRunningException as e:
        assert "ended before the stream completed" in str(e), e
    wait_for(lambda: not sbx.is_running(), "the sandbox to expire")
    try:
        sbx.get_info()
        raise AssertionError("get_info of an expired sandbox did not raise")
    except SandboxNotFoundException:
        pass
    ok("expiry: the TTL ends the sandbox and its streams")


def main() -> None:
    sbx = Sandbox.create(envs={"FOO": "create", "BAR": "create"}, metadata={"suite": "e2b-interop", "k": "v"}, timeout=120)
    try:
        check_create_and_info(sbx)
        home = check_foreground(sbx)
        check_background(sbx)
        check_kill_and_stdin(sbx)
        check_command_timeout(sbx)
        check_files(sbx, home)
        check_timeouts_and_connect(sbx)
        check_pause_resume(sbx)
        check_faults(sbx)
        check_kill(sbx)
        check_expiry()
    finally:
        try:
            Sandbox.kill(sbx.sandbox_id)
        except Exception:
            pass
    print("e2b sdk against the emulator: all passed")


if __name__ == "__main__":
    try:
        main()
    finally:
        if _proc is not None:
            _proc.terminate()
            _proc.wait(timeout=10)
    sys.exit(0)
