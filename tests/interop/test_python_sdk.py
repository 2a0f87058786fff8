"""The official Python MCP SDK 2.x (`pip install mcp`) drives sandbox-mcp over stdio and HTTP.

In its default mode ("auto") the SDK probes server/discover and must settle on MCP 2026-07-28
(session-less: every tool gets sandbox_id); in "legacy" mode it sends initialize and must get
2025-11-25. The SDK validates every structuredContent against the tool's outputSchema, so a
schema mismatch fails here. Run by tests/interop/run.sh with the venv it creates; exits non-zero
on any failure. The 1.x SDK is driven by test_python_sdk_v1.py.
"""

import asyncio
import os
import sys
import tempfile
import time

from mcp import Client, StdioServerParameters

from sdk_server import http_server

BIN = os.environ["SANDBOX_MCP_BIN"]
EXPECTED_TOOLS = {
    "create_sandbox", "kill_sandbox", "run_command", "read_file", "write_file", "list_files",
    "start_task", "get_task", "cancel_task", "list_tasks", "delete_task", "list_sandboxes", "set_timeout",
    "set_network", "expose_port", "unexpose_port", "send_input", "resize_task",
}


async def exercise(client: Client, label: str, expected_version: str) -> None:
    assert client.protocol_version == expected_version, f"{label}: negotiated {client.protocol_version}"
    modern = expected_version == "2026-07-28"
    tools = await client.list_tools()
    names = {t.name for t in tools.tools}
    assert names == EXPECTED_TOOLS, f"{label}: tools {sorted(names)}"
    for t in tools.tools:
        assert t.description, f"{label}: {t.name} lacks a description"
    typed = sorted(t.name for t in tools.tools if t.output_schema)
    assert typed == ["get_task", "run_command"], f"{label}: outputSchema on {typed}"

    created = await client.call_tool("create_sandbox", {"timeout": 120})
    assert not created.is_error, created
    sandbox = created.structured_content["sandbox_id"]

    # Over HTTP a 2026-07-28 request has no session, hence no default sandbox: pass sandbox_id
    # everywhere (it works in every mode), and check that leaving it out says so.
    if modern and label.startswith("http"):
        bare = await client.call_tool("run_command", {"command": "true"})
        assert bare.is_error and "create_sandbox" in bare.content[0].text, bare
    ran = await client.call_tool("run_command", {"sandbox_id": sandbox, "command": "echo interop; exit 4"})
    assert not ran.is_error, ran
    assert ran.structured_content["exit_code"] == 4, ran.structured_content
    assert ran.structured_content["stdout"] == "interop\n", ran.structured_content

    wrote = await client.call_tool("write_file", {"sandbox_id": sandbox, "path": "a/b.txt", "content": "x"})
    assert wrote.structured_content["bytes_written"] == 1
    read = await client.call_tool("read_file", {"sandbox_id": sandbox, "path": "a/b.txt"})
    assert read.structured_content["content"] == "x"
    listed = await client.call_tool("list_files", {"sandbox_id": sandbox, "path": "a"})
    assert listed.structured_content["entries"][0]["name"] == "b.txt"

    started = await client.call_tool("start_task", {"sandbox_id": sandbox, "command": "printf task-out", "timeout": 60})
    assert not started.is_error, started
    task = started.structured_content["task_id"]
    deadline = time.monotonic() + 20
    while True:
        got = await client.call_tool("get_task", {"sandbox_id": sandbox, "task_id": task})
        assert not got.is_error, got
        if got.structured_content["state"] != "running" or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert got.structured_content["state"] == "succeeded", got.structured_content
    assert got.structured_content["stdout"] == "task-out"
    tasks = await client.call_tool("list_tasks", {"sandbox_id": sandbox})
    assert tasks.structured_content["count"] == 1
    long = await client.call_tool("start_task", {"sandbox_id": sandbox, "command": "sleep 60", "timeout": 120})
    cancelled = await client.call_tool(
        "cancel_task", {"sandbox_id": sandbox, "task_id": long.structured_content["task_id"]}
    )
    assert cancelled.structured_content["state"] == "cancelled", cancelled
    deleted = await client.call_tool("delete_task", {"sandbox_id": sandbox, "task_id": task})
    assert deleted.structured_content["deleted"] is True, deleted

    bad = await client.call_tool("run_command", {"sandbox_id": sandbox, "command": "true", "nope": 1})
    assert bad.is_error and "unknown argument" in bad.content[0].text, bad

    killed = await client.call_tool("kill_sandbox", {"sandbox_id": sandbox})
    assert killed.structured_content == {"sandbox_id": sandbox, "killed": True}
    print(f"python sdk over {label}: ok (protocol {client.protocol_version})")


async def over_stdio(home: str) -> None:
    env = {"SANDBOX_MCP_HOME": home, "PATH": os.environ["PATH"], "RUST_LOG": "warn"}
    params = StdioServerParameters(command=BIN, args=["stdio"], env=env)
    for mode, version in (("auto", "2026-07-28"), ("legacy", "2025-11-25")):
        async with Client(params, mode=mode) as client:
            await exercise(client, f"stdio ({mode} mode)", version)


async def over_http(home: str) -> None:
    with http_server(BIN, home) as url:
        for mode, version in (("auto", "2026-07-28"), ("legacy", "2025-11-25")):
            async with Client(url, mode=mode) as client:
                await exercise(client, f"http ({mode} mode)", version)


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="smcp-pysdk-") as home:
        await over_stdio(home)
        await over_http(home)


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
