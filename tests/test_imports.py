"""The rooms of h3_core and the direction of their imports (h3_core/__init__.py), read from the
source with `ast`: every import statement counts, at module level, inside functions and under
TYPE_CHECKING alike.

Rooms: model/, diffusion/, serving/, parallel/, weights/ and the top-level modules protocol,
config, media, images, references, factory and demo. Dependencies point down: serving ->
diffusion -> model; weights -> model; parallel -> diffusion, weights, model; factory alone puts
diffusion, weights and parallel together; protocol and config import nothing of h3_core, media
and references only config, images only protocol and config."""

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "h3_core"
MAX_LINES = 600

# room -> the rooms it must not import (a room may always import itself)
FORBIDDEN = {
    "model": {"diffusion", "weights", "serving", "parallel", "factory", "demo", "media"},
    "diffusion": {"serving", "weights", "parallel", "factory", "demo", "media"},
    "weights": {"serving", "diffusion", "parallel", "factory", "demo", "media"},
    "parallel": {"serving", "factory", "demo", "media"},
    "serving": {"weights", "parallel", "factory", "demo"},
    "factory": {"serving", "demo"},
}
LEAVES = {
    "protocol": set(),
    "config": {"protocol"},  # align_num_frames, torch-free in protocol
    "request_model": {"protocol"},  # torch-free: the client uses it
    "media": {"config"},
    "images": {"protocol", "config"},
    "references": {"config", "images"},
}  # the h3_core rooms each may import


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def room(module: str) -> str:
    """h3_core.serving.dit.step_loop -> serving; h3_core.protocol -> protocol; h3_core -> h3_core."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports(module: str) -> set[str]:
    """The h3_core modules `module` imports anywhere in its file (`from P import name` counts as
    P.name when that is a module, else as P)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in MODULES)
    return found


GRAPH = {module: imports(module) for module in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_import_graph_is_read_from_the_source():
    # a few edges known from the code, so the rules below test a real graph
    assert "h3_core.model.packed" in GRAPH["h3_core.model.dit"]
    assert "h3_core.model.dit" in GRAPH["h3_core.model"]
    assert "h3_core.serving.dit.admission" in GRAPH["h3_core.serving.dit.step_loop"]
    assert {"h3_core.parallel.workers", "h3_core.weights.checkpoint"} <= GRAPH["h3_core.factory"]
    assert "h3_core.model.encoder" in GRAPH["h3_core.factory"]  # imported inside load_engine


def test_find_cycle_reports_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_h3_core_has_no_import_cycle():
    assert find_cycle(GRAPH) is None


def test_dependencies_point_down():
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if room(target) in FORBIDDEN.get(room(module), set())
        or (room(module) in LEAVES and room(target) != room(module) and room(target) not in LEAVES[room(module)])
    )
    assert wrong == []


def test_only_the_factory_imports_sequence_parallelism():
    importers = {module for module, targets in GRAPH.items() for target in targets if room(target) == "parallel"}
    assert {module for module in importers if room(module) != "parallel"} == {"h3_core.factory"}


def test_no_file_is_longer_than_600_lines():
    lengths = {module: len(path.read_text().splitlines()) for module, path in MODULES.items()}
    assert {module: lines for module, lines in lengths.items() if lines > MAX_LINES} == {}


def test_every_package_says_what_lives_there():
    packages = [path for path in PACKAGE.rglob("__init__.py")]
    assert {module_name(path) for path in packages} == {
        "h3_core",
        "h3_core.model",
        "h3_core.diffusion",
        "h3_core.serving",
        "h3_core.parallel",
        "h3_core.weights",
    }
    assert [module_name(path) for path in packages if not ast.get_docstring(ast.parse(path.read_text()))] == []


def test_h3_vae_imports_neither_the_engine_nor_sequence_parallelism():
    """The h3_core modules h3_vae's model.py imports, imported in a fresh interpreter, load no
    engine, factory or parallel module, and no torch.distributed module beyond those `import
    torch` itself loads (torch 2.x imports torch.distributed with torch)."""
    tree = ast.parse((ROOT / "model_repository/h3_vae/1/model.py").read_text())
    statements = [
        ast.unparse(node)
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("h3_core")
    ]
    assert "from h3_core.model.vae import decode_clip" in statements
    code = "\n".join(
        [
            "import json, sys, torch",
            "before = set(sys.modules)",
            *statements,
            "print(json.dumps(sorted(set(sys.modules) - before)))",
        ]
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    loaded = json.loads(run.stdout.strip().splitlines()[-1])
    assert "h3_core.model.vae" in loaded
    assert [
        name
        for name in loaded
        if name in ("h3_core.diffusion.engine", "h3_core.factory")
        or name.startswith(("h3_core.parallel", "torch.distributed"))
    ] == []
