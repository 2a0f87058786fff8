"""What the Python SDK interop scripts share: sandbox-mcp over HTTP on a free loopback port.
Standard library only, so that both SDK venvs can import it (the scripts sit beside it)."""

import contextlib
import os
import subprocess
from typing import Iterator


@contextlib.contextmanager
def http_server(binary: str, home: str) -> Iterator[str]:
    """Starts `binary http` on 127.0.0.1:0 with state root `home` and yields its URL (read from
    the line it logs); terminates it afterwards."""
    env = dict(os.environ, SANDBOX_MCP_HOME=home, RUST_LOG="info")
    server = subprocess.Popen([binary, "http", "--listen", "127.0.0.1:0"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in server.stderr:
            if "listening on http://" in line:
                url = "http://" + line.split("listening on http://")[1].split()[0]
                break
        assert url, "the server did not report its address"
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
