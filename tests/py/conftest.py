"""Shared pytest helpers: where the built tools, the shared data and a build cache are."""

import os
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def shared_dir():
    return os.environ.get("TS_SHARED") or os.path.join(REPO, "..", "shared")


def fixtures_dir():
    return os.environ.get("TS_FIXTURES") or os.path.join(REPO, "tests", "fixtures")


def cache_dir():
    """Generated artefacts too large to commit (e.g. the real tokenizer.json), kept per build."""
    base = os.environ.get("TS_BUILD") or tempfile.gettempdir()
    path = os.path.join(base, "test-cache")
    os.makedirs(path, exist_ok=True)
    return path


def tool(name):
    """Path of a built helper program (tests/tools/<name>.c -> ts_<name>); skips if absent."""
    tools = os.environ.get("TS_TOOLS")
    if not tools:
        pytest.skip("TS_TOOLS is not set (run through ctest, or point it at <build>/tests)")
    path = os.path.join(tools, "ts_" + name)
    if not os.path.exists(path):
        pytest.skip(f"{path} is not built")
    return path


def run(args, timeout=600):
    """Runs a command; returns stdout, fails the test with stderr on a non-zero exit."""
    proc = subprocess.run(args, capture_output=True, timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, args))} exited {proc.returncode}:\n"
                    f"{proc.stderr.decode(errors='replace')[-4000:]}")
    return proc.stdout


def python_tool(script, *args):
    return run([sys.executable, os.path.join(REPO, "tools", script), *args])
