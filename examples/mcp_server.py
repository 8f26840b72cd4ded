"""An example MCP server (the official `mcp` package), started by one command:

    python -m examples.mcp_server                       # stdio
    python -m examples.mcp_server --http --port 8701    # streamable HTTP at /mcp

registered with `agentq modules add notes --command "python -m examples.mcp_server"` or
`agentq modules add notes http://127.0.0.1:8701/mcp --mcp`.

Tools: `add` (two numbers), `shout` (upper-case a text), `whoami` (the process id: one
session per tool worker process), `fail` (raises: the model reads the error), `environ`
(the names of the variables in the server's environment: a stdio server gets an
allow-listed environment, never agentq's secrets), `sleep` (answers after some seconds:
past the module's time limit, the model reads a timeout).
"""
from __future__ import annotations

import argparse
import asyncio
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("agentq-example")


@server.tool(description="Add two numbers.")
def add(a: float, b: float) -> float:
    return a + b


@server.tool(description="Upper-case a text.")
def shout(text: str) -> str:
    return text.upper() + "!"


@server.tool(description="The server process's id.")
def whoami() -> dict:
    return {"pid": os.getpid()}


@server.tool(description="Always fails, with the given message.")
def fail(message: str) -> str:
    raise ToolError(message)


@server.tool(description="The names of the variables in this server's environment.")
def environ() -> dict:
    return {"names": sorted(os.environ)}


@server.tool(description="Answer after the given number of seconds.")
async def sleep(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return f"slept {seconds:g} s"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", action="store_true", help="streamable HTTP, not stdio")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8701)
    args = parser.parse_args(argv)
    if args.http:
        print(f"http://{args.host}:{args.port}/mcp", flush=True)
        server.run("streamable-http", host=args.host, port=args.port)
    else:
        server.run()


if __name__ == "__main__":
    main()
