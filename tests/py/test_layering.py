"""The layer boundaries of docs/ARCHITECTURE.md, checked on the include graph: each layer of
src/ includes only itself and the layers under it, and the CLI and the server never include a
model or backend header."""
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

# layer -> the layers (directories under src/) it may include, besides itself and tessera.h
ALLOWED = {
    "base": set(),
    "format": {"base"},
    "text": {"base", "format"},
    "backend": {"base"},
    "model": {"base", "format", "backend"},
    "engine": {"base", "format", "backend", "model", "text"},
    "serve": {"base", "text"},
    "cli": {"serve"},
    "image": {"base"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def includes():
    for path in SRC.rglob("*"):
        if path.suffix not in (".c", ".h", ".cu", ".cuh"):
            continue
        layer = path.relative_to(SRC).parts[0]
        for inc in INCLUDE.findall(path.read_text(errors="replace")):
            yield path.relative_to(ROOT), layer, inc


def test_every_layer_is_known():
    layers = {p.name for p in SRC.iterdir() if p.is_dir()}
    assert layers <= set(ALLOWED), f"unknown layers {layers - set(ALLOWED)}"


def test_includes_go_down_only():
    bad = []
    for path, layer, inc in includes():
        if inc == "tessera.h":
            continue
        target = inc.split("/")[0] if "/" in inc else None
        if target is None:
            bad.append(f"{path}: '{inc}' (include internal headers by layer path)")
        elif target != layer and target not in ALLOWED[layer]:
            bad.append(f"{path}: {layer}/ includes {inc}")
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_check_catches_a_violation(tmp_path, monkeypatch):
    # the checker itself must fail on a CLI file that reaches into the model layer
    fake = tmp_path / "src" / "cli"
    fake.mkdir(parents=True)
    (fake / "x.c").write_text('#include "model/model.h"\n')
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path / "src")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    try:
        test_includes_go_down_only()
    except AssertionError as e:
        assert "cli/ includes model/model.h" in str(e)
    else:
        raise AssertionError("a violation went unnoticed")
