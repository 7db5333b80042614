"""conforms.py against jsonschema: whenever it answers, it answers as jsonschema does (True: no schema error, False:
some), over the sample manifests and many mutations of them (hypothesis), and it answers for every valid sample (so
loading one imports no jsonschema)."""

from __future__ import annotations

import copy
import functools
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from aggregator.manifest.conforms import conforms
from aggregator.manifest.schema import validation_schema
from aggregator.manifest.validate import FORMAT_CHECKER
from aggregator.manifest.yaml_marks import load_marked

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "sample-configs").glob("*.yaml"))

FUZZ = settings(max_examples=1500, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

ODD = [None, True, False, 0, 1, -1, 1.0, 1.5, -0.5, math.nan, math.inf, 10**20, "", " ", "x", "1", "true", "30s",
       "5m", "1h30m", "10MiB", "-1", "./docs", "docs://{path}", "docs://{+path}", "n://{+p}{?q,r}", "a:b", "a b:c",
       "{broken", "no-scheme", "https://example.com/x", "2026-01-15T09:00:00Z", "2026-13-45T99:99:99Z", "2026-01-15",
       "file", "markdown", "json", "csv", "RS256", "light", "user", "**/*.md", "é", "Bad Id!", "_ok.id-1", [], {},
       ["a"], ["a", "a"], [1, True], [1, 1.0], [[1], [True], [1]], ["x", 1], {"a": 1}, {"text": "t"},
       {"source": "s", "path": "p"}, {"uri": "a:b", "name": "n", "text": "t"}]


@functools.cache
def _validator() -> Draft202012Validator:
    """One validator for every example: it keeps nothing between calls but the schema's resolved references."""
    return Draft202012Validator(validation_schema(), format_checker=FORMAT_CHECKER)


def _schema_errors(data: Any) -> bool:
    return next(iter(_validator().iter_errors(data)), None) is not None


@functools.cache
def _sample(path: Path) -> Any:
    """The sample's data, parsed once (the 1,500 examples mutate deep copies of it, never it)."""
    marked, issues = load_marked(path.read_text(encoding="utf-8"), str(path))
    assert marked is not None, issues
    return marked.data


def _paths(node: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [here]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, here + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            found += _paths(value, here + (index,))
    return found


def _mutated(data: Any, path: tuple[Any, ...], how: str, value: Any) -> Any:
    data = copy.deepcopy(data)
    if not path:
        return value if how == "set" else data
    parent = data
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if how == "set":
        parent[last] = copy.deepcopy(value)
    elif how == "delete":
        del parent[last]
    elif how == "add" and isinstance(parent[last], dict):
        parent[last]["unknownKey" if not isinstance(value, str) or not value else value] = value
    elif how == "duplicate" and isinstance(parent[last], list) and parent[last]:
        parent[last].append(copy.deepcopy(parent[last][0]))
    return data


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.name)
def test_every_sample_conforms_without_jsonschema(sample: Path) -> None:
    data = _sample(sample)
    assert conforms(validation_schema(), data) is True
    assert not _schema_errors(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


@FUZZ
@given(st.sampled_from(SAMPLES), st.integers(min_value=0), st.sampled_from(["set", "set", "delete", "add",
                                                                           "duplicate"]),
       st.sampled_from(ODD) | json_values)
def test_conforms_answers_as_jsonschema_does(sample: Path, pick: int, how: str, value: Any) -> None:
    data = _sample(sample)
    paths = _paths(data)
    mutated = _mutated(data, paths[pick % len(paths)], how, value)
    answer = conforms(validation_schema(), mutated)
    if answer is not None:
        assert answer is not _schema_errors(mutated), mutated


def test_a_valid_manifest_loads_without_importing_jsonschema() -> None:
    code = ("import sys\nfrom aggregator.manifest import load_manifest\n"
            f"load_manifest({str(ROOT / 'sample-configs' / 'quickstart.yaml')!r})\n"
            "assert 'jsonschema' not in sys.modules, 'jsonschema imported'\n"
            "from aggregator.manifest import ManifestError\n"
            "from aggregator.manifest.load import parse_manifest\n"
            "try:\n    parse_manifest('version: 1\\nserver: {name: 1}\\n', 'm.yaml', __import__('pathlib').Path('.'))\n"
            "except ManifestError as e:\n    assert 'jsonschema' in sys.modules and e.issues\n"
            "else:\n    raise AssertionError('accepted')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
