"""The official Python MCP SDK's last 1.x line (`pip install "mcp<2"`) drives sandbox-mcp over
stdio and HTTP with the initialize handshake (2025-11-25), as clients pinned to 1.x still do.

Run by tests/interop/run.sh with the second venv setup.sh creates; exits non-zero on any failure.
"""

import asyncio
import os
import sys
import tempfile
import warnings

from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

from sdk_server import http_server

BIN = os.environ["SANDBOX_MCP_BIN"]

# The SDK warns that its experimental tasks client will move to an extension; it is what 1.x
# clients use today.
warnings.filterwarnings("ignore", category=DeprecationWarning, message="The experimental tasks API")


async def exercise(session: ClientSession, label: str) -> None:
    init = await session.initialize()
    assert init.protocolVersion == "2025-11-25", f"{label}: negotiated {init.protocolVersion}"
    tools = await session.list_tools()
    assert "start_task" in {t.name for t in tools.tools}, tools
    created = await session.call_tool("create_sandbox", {"timeout": 120})
    assert not created.isError, created
    sandbox = created.structuredContent["sandbox_id"]
    ran = await session.call_tool("run_command", {"command": "echo v1"})
    assert ran.structuredContent["stdout"] == "v1\n", ran
    await session.send_ping()
    # 2025-11-25 protocol tasks through the SDK's experimental client.
    assert init.capabilities.tasks is not None, init.capabilities
    run = next(t for t in tools.tools if t.name == "run_command")
    assert run.execution is not None and run.execution.taskSupport == "optional", run
    created_task = await session.experimental.call_tool_as_task("run_command", {"command": "sleep 1; echo as-task; exit 2"})
    task_id = created_task.task.taskId
    assert created_task.task.status == "working", created_task
    last = None
    async for status in session.experimental.poll_task(task_id):
        last = status
    assert last is not None and last.status == "completed", last
    final = await session.experimental.get_task_result(task_id, types.CallToolResult)
    assert final.structuredContent["exit_code"] == 2, final
    assert final.structuredContent["stdout"] == "as-task\n", final
    listed = await session.experimental.list_tasks()
    assert task_id in {t.taskId for t in listed.tasks}, listed
    long_task = await session.experimental.call_tool_as_task("run_command", {"command": "sleep 60"})
    cancelled = await session.experimental.cancel_task(long_task.task.taskId)
    assert cancelled.status == "cancelled", cancelled
    killed = await session.call_tool("kill_sandbox", {"sandbox_id": sandbox})
    assert killed.structuredContent["killed"] is True, killed
    print(f"python sdk 1.x over {label}: ok (protocol {init.protocolVersion}, experimental tasks: call_tool_as_task, poll_task, get_task_result, list, cancel)")


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="smcp-pysdk1-") as home:
        env = {"SANDBOX_MCP_HOME": home, "PATH": os.environ["PATH"], "RUST_LOG": "warn"}
        async with stdio_client(StdioServerParameters(command=BIN, args=["stdio"], env=env)) as (read, write):
            async with ClientSession(read, write) as session:
                await exercise(session, "stdio")
        with http_server(BIN, home) as url:
            async with streamablehttp_client(url) as (read, write, _):
                async with ClientSession(read, write) as session:
                    await exercise(session, "http")


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
