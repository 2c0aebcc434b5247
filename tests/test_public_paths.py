"""Every documented import path works, and the package root holds only the public faces and the layer folders.

The faces are thin: they hand on names defined in the layers. A path a user was told about must keep working
when the code behind it moves.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nnmem_callbacks"

#: (module, names it must offer, the optional framework it needs)
DOCUMENTED = [
    (
        "nnmem_callbacks",
        [
            "estimate_training",
            "estimate_per_rank",
            "MemoryEstimate",
            "Category",
            "PhaseLine",
            "Plan",
            "MemoryBudgetExceeded",
            "Strategy",
            "format_bytes",
            "format_summary",
            "parse_bytes",
            "__version__",
        ],
        "torch",
    ),
    (
        "nnmem_callbacks.torch",
        ["estimate_training", "estimate_per_rank", "EstimationInputError", "UnsupportedKernelError"],
        "torch",
    ),
    ("nnmem_callbacks.lightning", ["MemoryBudgetCallback", "MemoryBudgetExceeded"], "pytorch_lightning"),
    ("nnmem_callbacks.lightning_pytorch", ["MemoryBudgetCallback", "MemoryBudgetExceeded"], "lightning"),
    (
        "nnmem_callbacks.keras",
        ["MemoryBudgetCallback", "estimate_training", "fit_plan", "FitPlan", "KerasEstimationError"],
        "keras",
    ),
    (
        "nnmem_callbacks.transformers",
        ["MemoryBudgetCallback", "MemoryBudgetExceeded", "plan_training_arguments", "TrainingPlan"],
        "transformers",
    ),
    ("nnmem_callbacks.cli", ["main"], None),
]


@pytest.mark.parametrize("module, names, needs", DOCUMENTED, ids=[row[0] for row in DOCUMENTED])
def test_documented_paths_import(module, names, needs):
    if needs is not None:
        pytest.importorskip(needs)
    face = importlib.import_module(module)
    missing = [name for name in names if not hasattr(face, name)]
    assert not missing, f"{module} lacks {missing}"
    exported = getattr(face, "__all__", None)
    assert exported is not None, f"{module} declares no __all__"
    assert set(names) - {"__version__"} <= set(exported)


def test_the_package_root_holds_only_faces_and_layers():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert modules == ["__init__.py", "keras.py", "lightning.py", "lightning_pytorch.py", "torch.py", "transformers.py"]
    assert len(modules) <= 8
    layers = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert layers == ["adapters", "allocators", "cli", "core", "estimators", "hardware", "monitoring", "probes"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_module_declares_all():
    missing = []
    for path in _sources():
        tree = ast.parse(path.read_text())
        defines = any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_") for n in tree.body)
        declares = any(
            isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
            for n in tree.body
        )
        if defines and not declares:
            missing.append(_module_name(path))
    assert not missing, f"modules without __all__: {missing}"


def test_no_module_imports_another_modules_private_names():
    offenders = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nnmem_callbacks"):
                offenders += [
                    f"{_module_name(path)}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and a.name != "__version__"
                ]
    assert not offenders, offenders


def test_no_module_over_700_lines():
    long = {_module_name(p): n for p in _sources() if (n := len(p.read_text().splitlines())) > 700}
    assert not long, long


def _imports(path: Path) -> set[str]:
    """The package modules ``path`` imports (module-level and inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nnmem_callbacks"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                found.add(
                    candidate
                    if (PACKAGE.parent / (candidate.replace(".", "/") + ".py")).exists()
                    or (PACKAGE.parent / candidate.replace(".", "/")).is_dir()
                    else node.module
                )
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("nnmem_callbacks")}
    return found


def test_no_import_circles_in_the_package():
    graph = {_module_name(p): _imports(p) for p in _sources()}
    graph = {m: {i for i in deps if i in graph and i != m} for m, deps in graph.items()}
    # a package's __init__ is imported with any of its modules: count only module -> module edges
    index, low, stack, on_stack, circles, counter = {}, {}, [], set(), [], [0]

    def connect(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    assert not circles, circles


def test_the_packaging_lists_every_package():
    import tomllib

    setuptools = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {_module_name(p.parent / "__init__.py") for p in PACKAGE.rglob("__init__.py")}
    assert set(setuptools["packages"]) == found | {"nnmem_callbacks.examples"}
    assert setuptools["package-dir"] == {"nnmem_callbacks.examples": "examples"}
