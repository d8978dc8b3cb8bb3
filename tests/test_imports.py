"""The rooms of the repository and the direction of their imports (docs/layout.md), read from the
source with `ast`: every import statement counts, at module level, inside functions and under
TYPE_CHECKING alike.

The core (h3_core.model, .diffusion, .inputs, .weights) speaks its own words: it imports no wire
module (h3_core.protocol, h3_core.request_model), no serving code, no launcher, client or Videos
API and nothing of Triton. Each serving room (h3_core.serving.dit, .vae, .encoder) imports the
shared serving infrastructure (h3_core.serving.shared), the core and the wire modules, never
another room; shared/ imports no room. Inside the core dependencies point down: diffusion ->
model; inputs and weights -> model; parallel -> diffusion, weights, model; factory alone puts
diffusion, weights and parallel together. No import cycle among all tracked modules (h3_core,
server, client, videos_api, model_repository/*/1/model.py, benchmarks, training, scripts, tests),
and no tracked .py file over 600 lines in any package."""

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 600
SKIPPED = {".venv", "checkpoints", "build", ".git"}  # top-level folders that hold no project source

CORE = ("h3_core.model", "h3_core.diffusion", "h3_core.inputs", "h3_core.weights")
WIRE = ("h3_core.protocol", "h3_core.request_model")
# what the core never imports: the wire, serving, the launcher, the client, the Videos API, Triton
NOT_IN_CORE = WIRE + (
    "h3_core.serving",
    "server",
    "client",
    "videos_api",
    "triton_python_backend_utils",
    "tritonclient",
)
ROOMS = ("h3_core.serving.dit", "h3_core.serving.vae", "h3_core.serving.encoder")
SHARED = "h3_core.serving.shared"
# room -> the h3_core rooms it must not import (a room may always import itself)
FORBIDDEN = {
    "model": {"diffusion", "weights", "inputs", "serving", "parallel", "factory", "demo", "media"},
    "diffusion": {"serving", "weights", "inputs", "parallel", "factory", "demo", "media"},
    "inputs": {"diffusion", "serving", "weights", "parallel", "factory", "demo", "media"},
    "weights": {"serving", "diffusion", "inputs", "parallel", "factory", "demo", "media"},
    "parallel": {"serving", "factory", "demo", "media"},
    "serving": {"weights", "parallel", "factory", "demo"},
    "factory": {"serving", "demo"},
}
LEAVES = {
    "config": set(),  # torch-free: protocol re-exports its media constants
    "rules": {"config"},  # torch-free: protocol re-exports the prompt rule
    "protocol": {"config", "rules"},
    "request_model": {"protocol", "config", "rules"},  # a package, torch-free: the Videos API and the client use it
    "media": {"config"},
}  # the h3_core rooms each may import


def tracked_files() -> list[Path]:
    """The repository's tracked .py files (git ls-files; without git, every .py outside SKIPPED)."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        paths = [ROOT / name for name in listed]
    except (OSError, subprocess.CalledProcessError):
        paths = [path for path in ROOT.rglob("*.py") if path.relative_to(ROOT).parts[0] not in SKIPPED]
    return sorted(path for path in paths if path.is_file())


def module_name(path: Path) -> str:
    """h3_core/serving/dit/step_loop.py -> h3_core.serving.dit.step_loop; a package's __init__.py
    -> the package; model_repository/h3_dit/1/model.py -> model_repository.h3_dit.1.model."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = tracked_files()
MODULES = {module_name(path): path for path in FILES}


def imported_names(module: str) -> set[str]:
    """Every dotted name `module` imports anywhere in its file, resolved: relative imports against
    its package, `from P import name` as P.name when that is a module, and a bare name that is a
    sibling module (benchmarks put their own folder on sys.path) as that sibling."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def resolve(name: str) -> str:
        sibling = f"{package}.{name}" if package else name
        return sibling if name not in MODULES and sibling in MODULES else name

    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(resolve(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = resolve(node.module)
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names)
    return found


NAMES = {module: imported_names(module) for module in MODULES}
GRAPH = {module: {name for name in names if name in MODULES} for module, names in NAMES.items()}


def within(name: str, prefixes) -> bool:
    """Whether dotted `name` is one of `prefixes` or inside one of them."""
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def h3_room(module: str) -> str:
    """h3_core.serving.dit.step_loop -> serving; h3_core.protocol -> protocol; h3_core -> h3_core."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def serving_room(module: str) -> str | None:
    """h3_core.serving.dit.step_loop -> h3_core.serving.dit; None outside h3_core.serving's rooms."""
    return next((room for room in (*ROOMS, SHARED) if within(module, [room])), None)


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
    assert "h3_core.serving.shared.registry" in GRAPH["h3_core.serving.dit.step_loop"]
    assert {"h3_core.parallel.workers", "h3_core.weights.checkpoint"} <= GRAPH["h3_core.factory"]
    assert "h3_core.model.encoder" in GRAPH["h3_core.factory"]  # imported inside load_engine
    assert "h3_core.serving.shared.triton" in GRAPH["model_repository.h3_dit.1.model"]
    assert "videos_api.app" in GRAPH["videos_api.__main__"]
    assert "benchmarks.engine_bench" in GRAPH["benchmarks.batch_invariance"]  # a bare sibling name
    assert "tests.serving" in GRAPH["tests.test_client_install"]  # a relative import in tests
    assert "triton_python_backend_utils" in NAMES["h3_core.serving.shared.triton"]  # under TYPE_CHECKING
    assert {"server", "client", "videos_api", "benchmarks", "training", "scripts", "tests"} <= {
        module.split(".")[0] for module in MODULES
    }


def test_find_cycle_reports_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_repository_has_no_import_cycle():
    assert find_cycle(GRAPH) is None


def test_the_core_imports_no_wire_serving_launcher_client_or_triton():
    wrong = sorted(
        f"{module} imports {name}"
        for module, names in NAMES.items()
        if within(module, CORE)
        for name in names
        if within(name, NOT_IN_CORE)
    )
    assert wrong == []


def test_each_serving_room_imports_only_the_shared_room_the_core_and_the_wire():
    wrong = sorted(
        f"{module} imports {name}"
        for module, names in NAMES.items()
        if serving_room(module) is not None
        for name in names
        if within(
            name, ("h3_core.serving", "server", "client", "videos_api", "tritonclient", "triton_python_backend_utils")
        )
        and serving_room(name) not in (serving_room(module), SHARED)
        and module != f"{SHARED}.triton"  # the python models' Triton helpers build Triton's objects
    )
    assert wrong == []


def test_only_serving_the_client_the_videos_api_and_the_models_import_the_wire():
    importers = {
        module.split(".")[0] if not module.startswith("h3_core.serving") else "h3_core.serving"
        for module, names in NAMES.items()
        if module.startswith(("h3_core", "client", "videos_api", "model_repository"))
        and not within(module, WIRE)
        and any(within(name, WIRE) for name in names)
    }
    assert importers == {"h3_core.serving", "client", "videos_api", "model_repository"}


def test_dependencies_inside_h3_core_point_down():
    wrong = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if module.startswith("h3_core.")
        for target in targets
        if target.startswith("h3_core.")
        and (
            h3_room(target) in FORBIDDEN.get(h3_room(module), set())
            or (
                h3_room(module) in LEAVES
                and h3_room(target) != h3_room(module)
                and h3_room(target) not in LEAVES[h3_room(module)]
            )
        )
    )
    assert wrong == []


def test_only_the_factory_imports_sequence_parallelism():
    importers = {
        module
        for module, targets in GRAPH.items()
        if module.startswith("h3_core")
        for target in targets
        if h3_room(target) == "parallel"
    }
    assert {module for module in importers if h3_room(module) != "parallel"} == {"h3_core.factory"}


def test_no_tracked_file_is_longer_than_600_lines():
    lengths = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in FILES}
    assert {name: lines for name, lines in lengths.items() if lines > MAX_LINES} == {}


def test_every_package_says_what_lives_there():
    packages = sorted((ROOT / "h3_core").rglob("__init__.py")) + [ROOT / "videos_api/__init__.py"]
    assert {module_name(path) for path in packages} == {
        "h3_core",
        "h3_core.model",
        "h3_core.diffusion",
        "h3_core.inputs",
        "h3_core.request_model",
        "h3_core.serving",
        "h3_core.serving.dit",
        "h3_core.serving.vae",
        "h3_core.serving.encoder",
        "h3_core.serving.shared",
        "h3_core.parallel",
        "h3_core.weights",
        "videos_api",
    }
    assert [module_name(path) for path in packages if not ast.get_docstring(ast.parse(path.read_text()))] == []


def test_the_wire_contract_imports_without_torch():
    """protocol (and the core constants and rules it re-exports) load in a fresh interpreter
    without torch: the client installs without it."""
    code = "import json, sys; import h3_core.protocol; print(json.dumps('torch' in sys.modules))"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert (run.returncode, run.stdout.strip()) == (0, "false"), run.stderr


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
