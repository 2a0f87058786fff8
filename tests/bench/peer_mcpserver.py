"""The Python peer of the benchmarks: the official MCP SDK's high-level server (FastMCP, called
MCPServer since mcp 2) over stdio, with one trivial tool, as a plain user of the SDK writes it."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("bench-peer")


@server.tool()
def echo(message: str) -> str:
    """Returns its argument."""
    return message


if __name__ == "__main__":
    server.run("stdio")
