"""The quick start as a new user meets it: what `make run` installs, the package name pip resolves, the hint a
terminal gets from `serve`, and the README's client configurations driven with the official MCP client."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SAMPLE = ROOT / "sample-configs" / "quickstart.yaml"
make = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def planned_installs(target: str, venv: Path) -> list[str]:
    """The `pip install -e` lines (the project, with extras) `make -n TARGET` would run with the venv at `venv`."""
    planned = subprocess.run(["make", "-n", target, f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
    assert planned.returncode == 0, planned.stderr
    return [line for line in planned.stdout.splitlines() if "pip install" in line and " -e " in line]


def extras(install: str) -> set[str]:
    """The extras an `pip install -e '.[a,b]'` line asks for (empty for `-e .`)."""
    found = re.search(r"\.\[([^\]]*)\]", install)
    return set(found.group(1).split(",")) if found else set()


@make
def test_make_run_installs_only_what_serving_needs(tmp_path: Path) -> None:
    installs = planned_installs("run", tmp_path / "venv")
    assert installs, "make run installs the package"
    assert all(extras(line) == set() for line in installs), installs
    assert all(re.search(r"(^|\s)-e \.(\s|$)", line) for line in installs), installs


@make
def test_make_test_after_make_run_still_installs_the_test_extras(tmp_path: Path) -> None:
    """`make run` then `make test`: the runtime install does not count as the test install."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    ran = planned_installs("run", venv)
    stamp = re.search(r"touch (\S+)", subprocess.run(["make", "-n", "run", f"VENV={venv}"], cwd=ROOT,
                                                     capture_output=True, text=True, timeout=60).stdout)
    assert ran and stamp, "make run records its install"
    Path(stamp.group(1)).touch()  # as if `make run` had installed
    assert planned_installs("run", venv) == []
    assert [extras(line) for line in planned_installs("test", venv)] == [{"test"}]
    assert all("bench" not in extras(line) for line in planned_installs("test", venv))
    assert any("bench" in extras(line) for line in planned_installs("bench", venv))


@make
def test_make_run_keeps_pip_quiet(tmp_path: Path) -> None:
    for target in ("run", "test"):
        planned = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                                 text=True, timeout=60).stdout
        for line in (line for line in planned.splitlines() if "pip install" in line):
            assert "--disable-pip-version-check" in line and re.search(r"(^|\s)(-q|--quiet)\b", line), line


def test_the_distribution_is_not_the_unrelated_aggregator_on_pypi() -> None:
    """PyPI's `aggregator` is someone else's package: ours is `mcp-aggregator`, its extras name it, its import
    package and command stay `aggregator`, and its version is the package's own."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    meta = project["project"]
    assert meta["name"] == "mcp-aggregator"
    assert meta["scripts"] == {"aggregator": "aggregator.launch:main"}
    assert "version" in meta.get("dynamic", []) and \
        project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "aggregator.__version__"}
    for extra, requirements in meta["optional-dependencies"].items():
        for requirement in requirements:
            assert not requirement.startswith("aggregator["), (extra, requirement)


def test_no_install_line_names_the_unrelated_package() -> None:
    """Every `pip install` a user might copy (README, docs, samples, error messages) names mcp-aggregator."""
    offending = []
    files = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "sample-configs").rglob("*.yaml"),
             *(ROOT / "aggregator").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.md")]
    for path in files:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"(?<![\w-])aggregator\[", line):
                offending.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offending == []
    assert "pip install 'mcp-aggregator[remote]'" in README


def serve_on_a_terminal(args: list[str]) -> tuple[bytes, str]:
    """Run `aggregator ARGS` with a pseudo-terminal as stdin; its stdout and stderr once it is serving."""
    import pty

    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "aggregator", *args], stdin=slave, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    os.close(slave)
    try:
        stderr = b""
        deadline = time.monotonic() + 60
        while b"ready in" not in stderr and time.monotonic() < deadline and process.poll() is None:
            ready, _, _ = select.select([process.stderr], [], [], 1)
            if ready:
                stderr += os.read(process.stderr.fileno(), 65536)  # type: ignore[union-attr]
        os.write(master, b"\x04")  # Ctrl-D: end of input, so the server stops by itself
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    return out, (stderr + err).decode()


def test_serve_on_a_terminal_explains_itself_on_stderr_only() -> None:
    out, err = serve_on_a_terminal(["serve", str(SAMPLE)])
    assert out == b""  # stdout is the protocol's
    assert "MCP server" in err and "waiting for a client on stdin" in err
    assert "make demo" in err and "aggregator list" in err
    assert str(SAMPLE) in err and '"command"' in err  # a client configuration to paste, with this manifest


def test_serve_from_a_client_says_nothing_extra() -> None:
    """A client's pipe is not a terminal: no hint (the client reads stdout; stderr stays one summary line)."""
    served = subprocess.run([sys.executable, "-m", "aggregator", "serve", str(SAMPLE)], stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert served.returncode == 0, served.stderr
    assert served.stdout == "" and "waiting for a client" not in served.stderr


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def json_blocks() -> list[dict]:
    """The README's ```json blocks, parsed (a block that is not JSON fails here)."""
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", README, re.S)]


def local_command(entry: dict) -> StdioServerParameters:
    """A README client entry with its placeholder paths pointed at this checkout (and this Python)."""
    command, args = entry["command"], [arg.replace("/path/to/aggregator", str(ROOT)) for arg in entry["args"]]
    assert command == "/path/to/aggregator/.venv/bin/aggregator", command
    assert Path(args[-1]).is_file(), args
    return StdioServerParameters(command=sys.executable, args=["-m", "aggregator", *args],
                                 env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")})


def stdio_entries() -> dict[str, dict]:
    """Each client's stdio server entry in the README: Claude Desktop and Cursor (mcpServers), VS Code (servers)."""
    found: dict[str, dict] = {}
    for block in json_blocks():
        for key, servers in block.items():
            for name, entry in servers.items():
                if "command" in entry:
                    found[f"{key}.{name}"] = entry
    return found


def test_readme_has_a_config_for_each_client() -> None:
    blocks = json_blocks()
    assert any("mcpServers" in block for block in blocks)  # Claude Desktop, Cursor
    vscode = [block["servers"] for block in blocks if "servers" in block]
    assert vscode and {entry["type"] for servers in vscode for entry in servers.values()} == {"stdio", "http"}
    assert [entry["url"] for servers in vscode for entry in servers.values() if entry["type"] == "http"] == \
        ["http://127.0.0.1:8000/mcp"]
    for place in ("~/Library/Application Support/Claude/claude_desktop_config.json",
                  "%APPDATA%\\Claude\\claude_desktop_config.json", ".vscode/mcp.json", "~/.cursor/mcp.json"):
        assert place in README, place
    assert "aggregator serve --http 8000" in README


@pytest.mark.parametrize("name", sorted(stdio_entries()))
def test_readme_client_config_serves_the_sample(name: str) -> None:
    """The pasted command starts, and the official client lists and reads the handbook through it."""
    params = local_command(stdio_entries()[name])

    async def check() -> None:
        async with Client(params) as client:
            listed = await client.list_resources()
            assert "handbook://docs/README.md" in [str(r.uri) for r in listed.resources]
            content = (await client.read_resource("handbook://docs/README.md")).contents[0]
            assert getattr(content, "text", "")

    anyio.run(check)


def test_readme_http_example_serves_at_its_url() -> None:
    """`aggregator serve --http 8000 MANIFEST` as the README writes it (on a free port), read at the README's URL."""
    from tests.test_server_http import free_port

    command = re.search(r"aggregator serve --http 8000 (\S+)", README)
    assert command, "the README shows how to serve over HTTP"
    manifest = ROOT / command.group(1)
    assert manifest.is_file(), command.group(0)
    port = free_port()
    url = "http://127.0.0.1:8000/mcp".replace("8000", str(port))
    process = subprocess.Popen([sys.executable, "-m", "aggregator", "serve", "--http", str(port), str(manifest)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "PYTHONPATH": str(ROOT)})

    snippet = re.search(r"```python\n(.*?)```", README, re.S)
    assert snippet and "http://127.0.0.1:8000/mcp" in snippet.group(1), "the README shows a client over HTTP"
    try:
        deadline = time.monotonic() + 60
        while not listening(port) and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.1)
        client = subprocess.run([sys.executable, "-c", snippet.group(1).replace("8000", str(port))],
                                capture_output=True, text=True, timeout=60,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert client.returncode == 0, client.stderr
        assert "handbook://docs/README.md" in client.stdout.splitlines()
    finally:
        process.terminate()
        assert process.wait(15) == 0


def test_readme_systemd_command_line_is_one_the_cli_takes() -> None:
    """The Deploying section's ExecStart parses as written: HTTP on all addresses, stateless workers, JSON logs."""
    import shlex

    from aggregator.cli import build_parser

    line = re.search(r"^ExecStart=(.*)$", README, re.M)
    assert line and "deploy/Dockerfile" in README and "## Running several replicas" in README
    words = shlex.split(line.group(1))
    assert words[0].endswith("/.venv/bin/aggregator")
    args = build_parser().parse_args(words[1:])
    assert (args.command, args.http, args.stateless, args.workers, args.log_format) == \
        ("serve", "0.0.0.0:8000", True, 4, "json")


def test_demo_into_a_closed_pipe_exits_quietly() -> None:
    """`make demo | head`: the demo stops quietly once its reader has gone."""
    process = subprocess.Popen([sys.executable, "-m", "aggregator.demo", str(SAMPLE)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    process.stdout.close()  # type: ignore[union-attr]
    err = process.stderr.read().decode()  # type: ignore[union-attr]
    assert process.wait(60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_demo_reads_a_running_http_server_by_url(tmp_path: Path, mode: str) -> None:
    """`python -m aggregator.demo http://HOST:PORT/mcp`: the same listing and first read from a server already
    running (how `make image-check` looks inside the image), on either wire."""
    from tests.replicas import replicas

    with replicas(SAMPLE, 1, tmp_path) as (replica,):
        shown = subprocess.run([sys.executable, "-m", "aggregator.demo", f"{replica.base}/mcp", mode],
                               capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert shown.returncode == 0, shown.stderr
    assert "connected to team-handbook over protocol" in shown.stdout
    assert re.search(r"^--- handbook://docs/\S+ ---\n#", shown.stdout, re.M), shown.stdout
