"""Safe YAML loading that remembers where every key and value was written.

Only YAML's standard tags are accepted (never Python objects). Duplicate keys are errors. Timestamps stay
strings: the schema checks them as `date-time` text, and the model hands them to clients as written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Iterator
from typing import Any

import yaml

from aggregator.manifest.model import ManifestIssue

__all__ = ["KeyPath", "Marked", "format_path", "load_marked"]

KeyPath = tuple[str | int, ...]
"""Where a value sits in the tree: `("resources", 0, "uri")`."""

# libyaml's composer reports the same (line, column) marks as the pure-Python one (checked by the tests),
# at a tenth of the cost; the Python one still writes the clearer syntax error messages.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_TAG = "tag:yaml.org,2002:"
_STANDARD_TAGS = frozenset(_TAG + t for t in ("map", "seq", "str", "int", "float", "bool", "null", "timestamp"))
MAX_VALUES = 100_000
"""Values a manifest may hold, counted as written and again with aliases expanded ("billion laughs")."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists, as written and with aliases expanded; real manifests need under 10.
libyaml's composer recurses in C, so the text's nesting is checked on the (iterative) event stream first."""
_EMPTY = "the manifest is empty; it needs at least 'version: 1' and 'server: {name: ...}'"


@dataclass
class Marked:
    """A plain Python tree plus the 1-based (line, col) of each value and of each mapping key."""

    file: str
    data: Any
    values: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)
    keys: dict[KeyPath, tuple[int, int]] = field(default_factory=dict)
    plain: set[KeyPath] = field(default_factory=set)
    """Unquoted scalars holding `${`: after interpolation they are re-read as YAML (`${PORT}` -> 8080)."""
    interpolated: set[KeyPath] = field(default_factory=set)
    """Values that took text from the environment: error messages never quote them."""
    refused: set[KeyPath] = field(default_factory=set)
    """Values already reported as unusable (a bad tag, an unset variable): later checks skip them."""
    origins: dict[KeyPath, str] = field(default_factory=dict)
    """Subtrees written in another file (an `extends:` base): path -> that file. Everything else is in `file`."""

    def where(self, path: KeyPath, *, key: bool = False) -> tuple[int, int]:
        """The position of `path` (of its key when `key`), else of its closest known ancestor."""
        return self.locate(path, key=key)[1:]

    def locate(self, path: KeyPath, *, key: bool = False) -> tuple[str, int, int]:
        """(file, line, col) of `path` (of its key when `key`), else of its closest known ancestor."""
        while path:
            if key and path in self.keys:
                return (self.file_of(path), *self.keys[path])
            if path in self.values:
                return (self.file_of(path), *self.values[path])
            path = path[:-1]
        return (self.file, *self.values.get((), (1, 1)))

    def file_of(self, path: KeyPath) -> str:
        """The file `path` was written in."""
        if self.origins:
            for n in range(len(path), 0, -1):
                found = self.origins.get(path[:n])
                if found is not None:
                    return found
        return self.file

    def hides(self, path: KeyPath) -> bool:
        """Whether messages must not show the value at `path`: it came from the environment, or it is a secret."""
        return path in self.interpolated or any(isinstance(k, str) and k.lower() in SECRET_KEYS for k in path[-1:])

    def quote(self, path: KeyPath, value: Any) -> str:
        """`value` as a message may show it: quoted and cut short, or not at all if it came from the environment
        or sits under a secret's key (a token written into a manifest by mistake must not reach CI logs)."""
        if path in self.interpolated:
            return "the value from the environment"
        if self.hides(path):
            return "the value (a secret: not shown)"
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."

    def issue(self, path: KeyPath, message: str, *, key: bool = False) -> ManifestIssue:
        file, line, col = self.locate(path, key=key)
        return ManifestIssue(file, line, col, format_path(path), message)


SECRET_KEYS = frozenset({"token", "secret", "password", "key", "access_token", "client_secret", "clientsecret",
                         "aws_secret_access_key", "aws_session_token", "session_token"})
"""Keys whose values messages never show (compared lower-case): tokens, passwords, fsspec/s3fs credentials."""


def format_path(path: KeyPath) -> str:
    """`("resources", 0, "uri")` -> `resources[0].uri`."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_marked(text: str, file: str) -> tuple[Marked | None, list[ManifestIssue]]:
    """Parse `text` (named `file` in issues); the marked tree, or None when there is nothing to check."""
    try:
        too_much = _scan(text, file)
        if too_much is not None:
            return None, [too_much]
        node = _compose(text)
    except yaml.MarkedYAMLError as exc:
        return None, [_syntax_issue(exc, file, text)]
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        col = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        return None, [ManifestIssue(file, line, col, "", f"character #x{exc.character:04x} is not allowed in YAML "
                                                         "(control characters must be escaped in a \"quoted\" string)")]
    except yaml.YAMLError as exc:
        return None, [ManifestIssue(file, 1, 1, "", f"YAML error: {exc}")]
    except RecursionError:
        return None, [ManifestIssue(file, 1, 1, "", "the manifest is nested too deeply")]
    if node is None:
        return None, [ManifestIssue(file, 1, 1, "", _EMPTY)]
    marked = Marked(file, None)
    builder = _TreeBuilder(marked)
    marked.data = builder.build(node, ())
    if marked.data is None and not builder.issues:
        return None, [ManifestIssue(file, 1, 1, "", _EMPTY)]
    if not isinstance(marked.data, dict) and not builder.issues:
        kind = "a list" if isinstance(marked.data, list) else "a single value"
        builder.issues.append(marked.issue((), f"the manifest must be a mapping of keys (version:, server:, ...) "
                                               f"at the top level, not {kind}"))
    return marked, builder.issues


def _scan(text: str, file: str) -> ManifestIssue | None:
    """A located issue when `text` nests deeper than MAX_DEPTH or writes more than MAX_VALUES values; found on the
    parser's event stream, which is iterative, before any composer recurses. YAML errors are raised."""
    try:
        return _limits(yaml.parse(text, Loader=_FAST_LOADER), file)
    except yaml.MarkedYAMLError:
        if _FAST_LOADER is yaml.SafeLoader:
            raise
    # The pure-Python parser names what it expected and what it found; it is iterative too.
    return _limits(yaml.parse(text, Loader=yaml.SafeLoader), file)


def _limits(events: Iterator[yaml.Event], file: str) -> ManifestIssue | None:
    open_: list[list[int]] = []  # per open collection: [is a mapping, nodes in it so far]
    values = 0
    for event in events:
        if isinstance(event, (yaml.ScalarEvent, yaml.AliasEvent, yaml.CollectionStartEvent)):
            parent = open_[-1] if open_ else None
            if parent is not None:
                parent[1] += 1
            if not (parent is not None and parent[0] and parent[1] % 2):  # a mapping's odd nodes are its keys
                values += 1
                if values > MAX_VALUES:
                    return _issue_at(event, file, f"the manifest holds more than {MAX_VALUES} values")
            if isinstance(event, yaml.CollectionStartEvent):
                if len(open_) >= MAX_DEPTH:
                    return _issue_at(event, file, f"values are nested more than {MAX_DEPTH} levels deep")
                open_.append([isinstance(event, yaml.MappingStartEvent), 0])
        elif isinstance(event, yaml.CollectionEndEvent):
            open_.pop()
    return None


def _issue_at(event: yaml.Event, file: str, message: str) -> ManifestIssue:
    mark = event.start_mark
    assert mark is not None  # the parser marks every event it emits; only hand-made events lack one
    return ManifestIssue(file, mark.line + 1, mark.column + 1, "", message)


def _compose(text: str) -> yaml.Node | None:
    try:
        return yaml.compose(text, Loader=_FAST_LOADER)
    except yaml.MarkedYAMLError:
        if _FAST_LOADER is yaml.SafeLoader:
            raise
    # Same marks, but the pure-Python parser names what it expected and what it found.
    return yaml.compose(text, Loader=yaml.SafeLoader)


def _syntax_issue(exc: yaml.MarkedYAMLError, file: str, text: str) -> ManifestIssue:
    mark = exc.problem_mark or exc.context_mark
    message = exc.problem or "invalid YAML"
    started = exc.context_mark
    opener = _unclosed(exc, text)
    if opener is not None and started is not None:
        mark = started  # where the quote or bracket opened: the end of the file is no place to look
    line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    if exc.context:
        where = f" started on line {started.line + 1}" if started and started.line + 1 != line else ""
        message = f"{message} ({exc.context}{where})"
    lines = text.splitlines()
    here = lines[line - 1] if mark and line <= len(lines) else ""
    message += _hint(exc, opener, started, here, col)
    if mark and "${" in here[max(col - 2, 0):col + 1]:
        # `key: ${VAR}` inside {...} or [...]: the `{` reads as a nested mapping.
        message += "; put a value holding ${...} in quotes"
    return ManifestIssue(file, line, col, "", f"YAML syntax error: {message}")


def _unclosed(exc: yaml.MarkedYAMLError, text: str) -> str | None:
    """The quote or bracket a syntax error at the end of the file shows was never closed, if that is what it is."""
    problem, context, started = exc.problem or "", exc.context or "", exc.context_mark
    if started is None or "end of stream" not in problem and "<stream end>" not in problem:
        return None
    if "quoted scalar" in context:
        return "quote"
    if "flow sequence" in context:
        return "["
    if "flow mapping" in context:
        return "{"
    return None


def _hint(exc: yaml.MarkedYAMLError, opener: str | None, started: Any, here: str, col: int) -> str:
    """What a person needs to fix the commonest YAML mistakes; "" when there is nothing better to say."""
    problem = exc.problem or ""
    if opener is not None:
        return f"; the {opener} opened on line {started.line + 1} is never closed"
    if "'\\t'" in problem or "tab character" in problem:
        return "; use spaces for indentation, not tabs"
    if problem.startswith("mapping values are not allowed"):
        return "; check the indentation of this key, or quote a value containing ': '"
    if problem.startswith("found character") and ("'@'" in problem or "'`'" in problem):
        return "; quote a value that starts with @ or `"
    before = here[col - 2] if 2 <= col <= len(here) + 1 else ""
    if "but got '<scalar>'" in problem and before in ("'", '"'):
        return ("; a ' inside a '...' value is written ''" if before == "'"
                else '; a " inside a "..." value is written \\"')
    if "expected <block end>, but found '-'" in problem:
        return "; a '- ' list item belongs under a key of its own (`key:`, then the items indented below it)"
    if "expected <block end>" in problem:
        return "; check this line's indentation against the lines above"
    if problem.startswith("could not find expected ':'"):
        return "; write `key: value` with a space after the colon, or quote a value that spans lines"
    return ""


class _TreeBuilder:
    """Turns composed nodes into dicts, lists and scalars, recording marks and refusing what is unsafe."""

    def __init__(self, marked: Marked) -> None:
        self.marked = marked
        self.issues: list[ManifestIssue] = []
        self.count = 0
        self.active: set[int] = set()  # ids of the nodes being built: an alias back to one is a cycle
        self.constructor = yaml.constructor.SafeConstructor()

    def fail(self, path: KeyPath, message: str, at: yaml.Node | None = None, *, refuse: bool = True) -> None:
        """Report a problem at `path` (or at node `at`); `refuse`: the value there is unusable (None)."""
        if refuse:
            self.marked.refused.add(path)
        if at is None:
            self.issues.append(self.marked.issue(path, message))
        else:
            line, col = at.start_mark.line + 1, at.start_mark.column + 1
            self.issues.append(ManifestIssue(self.marked.file, line, col, format_path(path), message))

    def build(self, node: yaml.Node, path: KeyPath) -> Any:
        self.marked.values[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
        self.count += 1
        if self.count > MAX_VALUES:
            if self.count == MAX_VALUES + 1:
                self.fail(path, f"the manifest expands to more than {MAX_VALUES} values (through aliases?)")
            return None
        if node.tag not in _STANDARD_TAGS:
            self.fail(path, f"unsupported YAML value: tag {node.tag!r} is not allowed (only plain YAML data)")
            return None
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, path)
        if id(node) in self.active:
            self.fail(path, "an alias refers to a value that contains it (a cycle)")
            return None
        if len(path) >= MAX_DEPTH:  # the top-level mapping is level 1
            self.fail(path, f"values are nested more than {MAX_DEPTH} levels deep")
            return None
        self.active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self.mapping(node, path)
            return [self.build(child, path + (i,)) for i, child in enumerate(node.value)]
        finally:
            self.active.discard(id(node))

    def scalar(self, node: yaml.ScalarNode, path: KeyPath) -> Any:
        if node.tag == _TAG + "timestamp":
            return node.value
        if not node.style and "${" in node.value:  # plain: None from PyYAML, "" from libyaml
            self.marked.plain.add(path)
        try:
            return self.constructor.construct_object(node, deep=True)
        except yaml.constructor.ConstructorError as exc:
            self.fail(path, f"unsupported YAML value: {exc.problem}")
        except (ValueError, LookupError):  # an explicit tag the text does not fit: `!!int x`, `!!bool maybe`
            short = node.tag.replace(_TAG, "!!")
            self.fail(path, f"unsupported YAML value: {node.value[:40]!r} is not a valid {short}")
        return None

    def mapping(self, node: yaml.MappingNode, path: KeyPath) -> dict[str, Any]:
        result: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        merges: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag == _TAG + "merge":
                merges.append((key_node, value_node))
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in _STANDARD_TAGS:
                self.fail(path, "a mapping key must be a plain word or string", at=key_node, refuse=False)
                continue
            key = key_node.value
            line, col = key_node.start_mark.line + 1, key_node.start_mark.column + 1
            if key in first_line:
                self.fail(path + (key,), f"duplicate key {key!r} (first defined on line {first_line[key]})",
                          at=key_node, refuse=False)
                continue
            first_line[key] = line
            self.marked.keys[path + (key,)] = (line, col)
            result[key] = self.build(value_node, path + (key,))
        for key_node, value_node in merges:
            self.merge(result, key_node, value_node, path)
        return result

    def merge(self, result: dict[str, Any], key_node: yaml.Node, value_node: yaml.Node, path: KeyPath) -> None:
        """`<<: *base` (or a list of them): keys written in the mapping itself win over merged ones."""
        sources = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
        for source in sources:
            if not isinstance(source, yaml.MappingNode):
                self.fail(path, "'<<' merges mappings only (write '<<: *anchor')", at=key_node, refuse=False)
                continue
            if id(source) in self.active:
                self.fail(path, "an alias refers to a value that contains it (a cycle)", at=key_node,
                          refuse=False)
                continue
            self.active.add(id(source))
            nested: list[tuple[yaml.Node, yaml.Node]] = []
            for sub_key, sub_value in source.value:
                if sub_key.tag == _TAG + "merge":
                    nested.append((sub_key, sub_value))
                    continue
                key = sub_key.value if isinstance(sub_key, yaml.ScalarNode) else None
                if key is None or key in result:
                    continue
                # A merged value is located where the anchor wrote it, which is where a fix belongs.
                self.marked.keys[path + (key,)] = (sub_key.start_mark.line + 1, sub_key.start_mark.column + 1)
                result[key] = self.build(sub_value, path + (key,))
            for nested_key, nested_value in nested:
                self.merge(result, nested_key, nested_value, path)
            self.active.discard(id(source))
