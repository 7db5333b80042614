"""Change notifications respect access scopes when they are sent: a caller never hears of a URI it cannot read,
even one that did not exist (or was public) when it started listening. A real server, the official client."""

from __future__ import annotations

from typing import Any

import anyio
from mcp.server.subscriptions import ResourceUpdated

from tests.test_auth import ALICE, BOB, Served, _client, served  # noqa: F401 - `served` is the fixture

LISTENED = ["secret://new.md", "docs://a.md"]


def test_listen_streams_hear_only_what_their_caller_may_read(served: Served) -> None:  # noqa: F811
    async def main() -> None:
        heard: dict[str, list[Any]] = {"alice": [], "bob": []}
        async with _client(served.url, ALICE, "auto") as alice, _client(served.url, BOB, "auto") as bob:
            async with alice.listen(resource_subscriptions=LISTENED) as a_sub, \
                    bob.listen(resource_subscriptions=LISTENED) as b_sub:
                async def collect(name: str, sub: Any) -> None:
                    async for event in sub:
                        heard[name].append(event)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(collect, "alice", a_sub)
                    tg.start_soon(collect, "bob", b_sub)
                    await anyio.sleep(0.3)
                    new = served.folder / "secret" / "new.md"
                    new.write_text("# new secret\n")  # a hidden URI appears ...
                    await anyio.sleep(0.5)
                    new.write_text("# new secret, edited\n")  # ... and changes
                    with anyio.fail_after(10):
                        while ResourceUpdated(uri="secret://new.md") not in heard["alice"]:
                            await anyio.sleep(0.05)
                    (served.folder / "docs" / "a.md").write_text("# public A, edited\n")
                    with anyio.fail_after(10):
                        while ResourceUpdated(uri="docs://a.md") not in heard["bob"]:
                            await anyio.sleep(0.05)
                    await anyio.sleep(0.3)
                    tg.cancel_scope.cancel()
        # Bob hears the public change, never the secret one, though he listened for its URI before it existed.
        assert ResourceUpdated(uri="secret://new.md") not in heard["bob"], heard["bob"]
        assert ResourceUpdated(uri="docs://a.md") in heard["alice"]

    try:
        anyio.run(main)
    finally:
        (served.folder / "docs" / "a.md").write_text("# public A\n")
        (served.folder / "secret" / "new.md").unlink(missing_ok=True)
