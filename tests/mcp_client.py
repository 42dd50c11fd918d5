"""Drives `stallscope mcp` with the official Python SDK (`mcp`) as the client.

Reads a plan as JSON on stdin: {"command": str, "args": [str], "env": {str: str},
"calls": [[tool, {arguments}], ...]}; starts the server over stdio, lists its tools, makes
each call in order in one session, and prints {"tools": [...], "results": [{"is_error": bool,
"text": str}, ...]} as JSON. An exception in a call is kept as that call's result (a protocol
error), so one failure shows which call it was.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client


async def main(plan):
    params = StdioServerParameters(
        command=plan["command"], args=plan.get("args", []), env=plan.get("env")
    )
    out = {"tools": [], "results": []}
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            listed = await session.list_tools()
            out["tools"] = [t.name for t in listed.tools]
            for name, arguments in plan["calls"]:
                try:
                    r = await session.call_tool(name, arguments)
                    text = "\n".join(c.text for c in r.content if getattr(c, "text", None))
                    out["results"].append({"is_error": bool(r.is_error), "text": text})
                except Exception as e:  # noqa: BLE001 - kept as the call's result
                    out["results"].append(
                        {"is_error": True, "protocol_error": True, "text": repr(e)}
                    )
    print(json.dumps(out))


asyncio.run(main(json.load(sys.stdin)))
