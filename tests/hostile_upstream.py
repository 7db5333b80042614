"""A hostile upstream on stdio (legacy wire only); the first argument picks how it misbehaves:

- `broken` (the default): `resources/list` answers a malformed result, `resources/read` starts a line and never
  finishes it, `resources/templates/list` pages forever with a cursor that repeats. Reads past the 1 MiB a test
  sets: `x://huge` (4 MiB, its id first, the line never ends), `x://huge-tail` (2 MiB, its id last),
  `x://huge-note` (a 2 MiB notification and no answer).
- `dupes`: `resources/list` names h://x twice (and h://y once).
- `loop`: every `resources/list` page names h://x and h://y and gives the same cursor again.
- `flip`: lists h://x and h://y until h://flip is read, then names h://x twice, adds h://z and says list_changed.
- `plain`: lists h://x and h://y and reads them, nothing else (-32601 for templates, as an SDK 1.x low-level
  server that registers only list and read), and advertises neither subscribe nor listChanged.
- `nocaps`: advertises no resources capability and answers -32601 to every resources method.
- `values`: lists and reads values no client should get: control characters (NUL, ESC, CR/LF) in URIs, names,
  titles, descriptions, mimeTypes, templates and completions, a 100 KB URI, a mimeType that would inject a
  header; reading h://t/lone answers text holding a lone surrogate (`LONE`).
- `numbers`: lists h://t/numbers, which answers a new text each time with a `ttlMs` of the next of `NUMBERS` (equal
  to 1 but for its type, or not a valid one), h://t/lone (as in `values`), h://t/meta (a text whose result has an
  8 KB `_meta`), h://t/decoy (a new text each time, not all ASCII, after a `_meta` whose string `"text"` comes first in the line) and
  h://t/escaped (a new text each time, of quotes, escapes and non-ASCII written as escapes). Its lines are
  written as Python's json.dumps writes them by default (`": "`, ASCII only).
- `slow`: lists h://x, h://slow, h://late and h://told; never answers a read of h://slow, answers one of h://late
  after `LATE` seconds, and answers one of h://told with what it was told (JSON: `slow`, the ids of the reads of
  h://slow it got; `cancelled`, the params of every notifications/cancelled).

In every mode but `broken`, reading a URI answers `text of <uri>` with the entry's listed mimeType, and templates are
listed (none but in `values`) unless said otherwise.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

MODE = sys.argv[1] if len(sys.argv) > 1 else "broken"
INJECTED = "image/png;\r\nX-Injected: 1"
PNG = "iVBORw0KGgo="  # the PNG signature, base64

VALUES = [
    {"uri": "h://ok", "name": "ok", "mimeType": "text/plain"},
    {"uri": "h://nul\u0000x", "name": "nul"},
    {"uri": "h://esc\u001b[31mx", "name": "esc"},
    {"uri": "h://crlf\r\nX-Injected: 1", "name": "crlf"},
    {"uri": "h://long/" + "a" * 100_000, "name": "long"},
    {"uri": "h://bad-mime", "name": "bad-mime", "mimeType": INJECTED},
    {"uri": "h://bad-text", "name": "bad\u001b[2Jname", "title": "title\r\nX-Injected: 1",
     "description": "line one\r\nline two\u0000\u001b[31m red", "mimeType": "text/plain"},
    {"uri": "h://long-text", "name": "n" * 5000, "description": "d" * 100_000},
]
VALUE_TEMPLATES = [
    {"uriTemplate": "h://t/{a}", "name": "t"},
    {"uriTemplate": "h://esc\u001b/{a}", "name": "esc"},
    {"uriTemplate": "h://m/{a}", "name": "m", "mimeType": INJECTED},
]
LONE = "half \ud800 of a pair: \u00e9"
"""What `values` reads at h://t/lone: text holding a lone surrogate (JSON's escape of it), which no UTF-8 encodes."""
NUMBERS: list[Any] = [1, True, 1.0, 1, "1", -1, 1]
"""The `ttlMs` of h://t/numbers' answers in turn (`values`)."""
numbers_read = 0
LATE = 1.5
"""Seconds before `slow` answers a read of h://late."""
flipped = False
told: dict[str, list[Any]] = {"slow": [], "cancelled": []}
"""What `slow` answers at h://told."""
_writing = threading.Lock()  # `slow`'s late answers are written from a timer's thread


def send(message: dict[str, Any]) -> None:
    with _writing:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def reply(rid: object, result: dict[str, Any]) -> None:
    send({"jsonrpc": "2.0", "id": rid, "result": result})


def fail(rid: object, code: int = -32601, message: str = "Method not found") -> None:
    send({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}})


def listed() -> list[dict[str, Any]]:
    plain = [{"uri": "h://x", "name": "x"}, {"uri": "h://y", "name": "y"}]
    if MODE == "values":
        return VALUES
    if MODE == "numbers":
        return [{"uri": f"h://t/{name}", "name": name} for name in ("numbers", "lone", "meta", "decoy", "escaped")]
    if MODE == "slow":
        return [plain[0], *({"uri": f"h://{name}", "name": name} for name in ("slow", "late", "told"))]
    if MODE == "dupes" or (MODE == "flip" and flipped):
        return [plain[0], {"uri": "h://x", "name": "x again"}, plain[1], *([{"uri": "h://z", "name": "z"}] if flipped
                                                                         else [])]
    return plain


def capabilities() -> dict[str, Any]:
    if MODE == "nocaps":
        return {}
    if MODE == "plain":
        return {"resources": {}}
    if MODE == "values":
        return {"resources": {"subscribe": True, "listChanged": True}, "completions": {}}
    return {"resources": {"subscribe": True, "listChanged": True}}


def orderly(method: str, rid: object, params: dict[str, Any]) -> None:
    """Every mode but `broken`."""
    global flipped, numbers_read
    if method == "initialize":
        reply(rid, {"protocolVersion": "2025-11-25", "capabilities": capabilities(),
                    "serverInfo": {"name": f"hostile-{MODE}", "version": "0"}})
    elif MODE == "nocaps" and method.startswith("resources/"):
        fail(rid)
    elif method == "resources/list":
        reply(rid, {"resources": listed(), **({"nextCursor": "again"} if MODE == "loop" else {})})
    elif method == "resources/templates/list" and MODE != "plain":
        reply(rid, {"resourceTemplates": VALUE_TEMPLATES if MODE == "values" else []})
    elif method == "resources/read" and MODE == "slow" and params["uri"] in ("h://slow", "h://late", "h://told"):
        slowly(rid, params["uri"])
    elif method == "resources/read":
        uri = params["uri"]
        if MODE == "flip" and uri == "h://flip":
            flipped = True
            send({"jsonrpc": "2.0", "method": "notifications/resources/list_changed"})
        mime = next((r.get("mimeType") for r in listed() if r["uri"] == uri), None)
        if uri.startswith("h://m/"):
            mime = INJECTED
        content = ({"blob": PNG} if mime == INJECTED else {"text": LONE if uri == "h://t/lone" else f"text of {uri}"})
        if uri == "h://t/meta":
            reply(rid, {"contents": [{"uri": uri, "mimeType": "text/plain", "text": "metadata"}],
                        "_meta": {"padding": "p" * 8000}})
            return
        if uri in ("h://t/decoy", "h://t/escaped"):
            numbers_read += 1
            text = (f"decoy read {numbers_read} \u2713" if uri == "h://t/decoy"
                    else f'read "{numbers_read}" \\ caf\u00e9 \u2028 \U0001f600 "text": \n')
            item = {"uri": uri, "mimeType": "text/plain", "text": text}
            reply(rid, {"_meta": {"text": "decoy"}, "contents": [item]} if uri == "h://t/decoy" else {"contents": [item]})
            return
        if uri == "h://t/numbers":
            numbers_read += 1
            reply(rid, {"contents": [{"uri": uri, "mimeType": "text/plain", "text": f"read {numbers_read}"}],
                        "ttlMs": NUMBERS[(numbers_read - 1) % len(NUMBERS)]})
            return
        reply(rid, {"contents": [{"uri": uri, **({"mimeType": mime} if mime else {}), **content}]})
    elif method == "completion/complete" and MODE == "values":
        reply(rid, {"completion": {"values": ["fine", "bad\u001b[2J", "x" * 5000]}})
    elif method == "ping" or (method in ("resources/subscribe", "resources/unsubscribe") and MODE != "plain"):
        reply(rid, {})
    else:
        fail(rid)


def slowly(rid: object, uri: str) -> None:
    """`slow`'s reads of h://slow (never answered), h://late (answered late) and h://told."""
    if uri == "h://slow":
        told["slow"].append(rid)
        return
    text = json.dumps(told) if uri == "h://told" else f"text of {uri}"
    answer = {"jsonrpc": "2.0", "id": rid, "result": {"contents": [{"uri": uri, "text": text}]}}
    if uri == "h://late":
        timer = threading.Timer(LATE, send, (answer,))
        timer.daemon = True  # the upstream ends with its stdin, answers still due or not
        timer.start()
    else:
        send(answer)


def broken(method: str, rid: object, params: dict[str, Any]) -> None:
    if method == "initialize":
        reply(rid, {"protocolVersion": "2025-11-25", "capabilities": {"resources": {}},
                    "serverInfo": {"name": "hostile", "version": "0"}})
    elif method == "resources/list":
        reply(rid, {"resources": 5})
    elif method == "resources/templates/list":
        reply(rid, {"resourceTemplates": [{"uriTemplate": "x://{a}", "name": "x"}], "nextCursor": "again"})
    elif method == "resources/read" and params["uri"] == "x://huge-tail":
        # The TypeScript SDK's order: the id comes last.
        sys.stdout.write('{"result": {"contents": [{"uri": "x://huge-tail", "text": "%s"}]}, "jsonrpc": "2.0", '
                         '"id": %s}\n' % ("x" * 2**21, json.dumps(rid)))
        sys.stdout.flush()
    elif method == "resources/read" and params["uri"] == "x://huge-note":
        # A notification past the cap (no id to fail), and no answer.
        send({"jsonrpc": "2.0", "method": "notifications/message", "params": {"level": "info", "data": "x" * 2**21}})
    elif method == "resources/read" and params["uri"] == "x://huge":
        sys.stdout.write('{"jsonrpc": "2.0", "id": %s, "result": {"contents": [{"uri": "x://huge", "text": "'
                         % json.dumps(rid))
        for _ in range(64):
            sys.stdout.write("x" * 65536)  # 4 MiB and no end of line
        sys.stdout.flush()
    elif method == "resources/read":
        sys.stdout.write('{"jsonrpc": "2.0", "id": %s, "result": {"contents": [{"uri": "x://' % json.dumps(rid))
        sys.stdout.flush()
        time.sleep(3600)
    else:
        fail(rid, message="no")


for line in sys.stdin:
    request = json.loads(line)
    if request.get("method") == "notifications/cancelled":
        told["cancelled"].append(request.get("params"))
    if request.get("id") is None:
        continue
    (broken if MODE == "broken" else orderly)(request.get("method", ""), request["id"], request.get("params") or {})
