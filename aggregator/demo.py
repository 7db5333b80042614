"""`python -m aggregator.demo MANIFEST|URL`: what an assistant sees, through the official MCP client: over stdio from
a manifest served here, or over Streamable HTTP from a running `serve --http` (its `/mcp` URL)."""

from __future__ import annotations

import sys

import anyio
from mcp import Client, StdioServerParameters


async def demo(target: str, mode: str = "auto") -> None:
    """List `target`'s resources and templates and print the first one's body."""
    params: str | StdioServerParameters = target
    if not target.startswith(("http://", "https://")):
        params = StdioServerParameters(command=sys.executable, args=["-m", "aggregator", "serve", target])
    async with Client(params, mode=mode) as client:
        info = client.server_info
        print(f"connected to {info.name if info else '?'} over protocol {client.protocol_version}")
        cursor, listed = None, []
        while True:
            page = await client.list_resources(cursor=cursor)
            listed.extend(page.resources)
            cursor = page.next_cursor
            if not cursor:
                break
        print(f"{len(listed)} resources:")
        for resource in listed:
            print(f"  {resource.uri}  ({resource.mime_type}, {resource.size} bytes)")
        templates = await client.list_resource_templates()
        for template in templates.resource_templates:
            print(f"  template {template.uri_template}")
        if listed:
            first = listed[0]
            content = (await client.read_resource(first.uri)).contents[0]
            body = getattr(content, "text", None)
            print(f"\n--- {first.uri} ---\n{body if body is not None else '<binary>'}")


def main() -> None:
    from aggregator.stdout import tolerate_reader_leaving

    tolerate_reader_leaving()  # `make demo | head` stops quietly
    if len(sys.argv) < 2:
        print("usage: python -m aggregator.demo MANIFEST|URL [legacy|auto]", file=sys.stderr)
        raise SystemExit(2)
    anyio.run(demo, sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "auto")


if __name__ == "__main__":
    main()
