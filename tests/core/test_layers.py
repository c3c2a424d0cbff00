"""The package's layers (docs/architecture.md): every import of a jetson_unet module points down or
across, never up, and no two modules import each other, directly or around a circle."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import jetson_unet

ROOT = Path(jetson_unet.__file__).resolve().parent
# bottom up; modules of one layer may import each other
LAYERS = [("errors", "paths", "files", "logs", "trace"), ("model",), ("backends",), ("ops",), ("build",),
          ("executor",), ("sampling",), ("pipeline",), ("cli",), ("tune", "bench", "serve"), ("__main__",)]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["jetson_unet"] + parts)


def imports() -> Dict[str, Set[str]]:
    """module -> the jetson_unet modules it imports (anywhere in it, functions included)."""
    out: Dict[str, Set[str]] = {}
    for path in ROOT.rglob("*.py"):
        src = module_name(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jetson_unet"):
                names = ([f"jetson_unet.{a.name}" for a in node.names if not a.name.startswith("__")]
                         if node.module == "jetson_unet" else [node.module])
                out.setdefault(src, set()).update(names)
            elif isinstance(node, ast.Import):
                out.setdefault(src, set()).update(a.name for a in node.names if a.name.startswith("jetson_unet."))
    return out


def layer(module: str) -> int:
    parts = module.split(".")
    return len(LAYERS) if len(parts) == 1 else RANK[parts[1]]


def test_every_import_points_down_or_across():
    data = {"jetson_unet.kernels", "jetson_unet.models"}   # package data
    up = sorted(f"{src} -> {dst}" for src, dsts in imports().items() for dst in dsts - data if layer(dst) > layer(src))
    assert not up, up


def test_no_import_circles():
    graph = imports()
    state: Dict[str, int] = {}
    circles: List[List[str]] = []

    def visit(node: str, path: List[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not circles, [" -> ".join(c) for c in circles]
