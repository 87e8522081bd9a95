"""The package's import graph has no cycle, counting every import: those inside functions and those under
``if TYPE_CHECKING:`` (annotations only) too. A module never reaches back up to a module that imports it, not even
lazily or for a type hint: a helper that needs a higher module's type takes the fields it reads instead. Lazy
imports for speed are fine as long as they close no cycle."""

import ast
import graphlib
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "dmlstudy"


def module_files(package: Path) -> dict[str, Path]:
    """Dotted module name → source file, for every module of ``package`` (a package is its ``__init__.py``)."""
    modules = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imported_names(tree: ast.AST, module: str, *, is_package: bool) -> set[str]:
    """Every dotted name an import of ``tree`` names, at any depth (module level, functions, classes, ``try``,
    both branches of ``if TYPE_CHECKING:``). ``from a import b`` names ``a`` and ``a.b`` (``b`` may be a module or
    a name of ``a``); relative imports are resolved against ``module``."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".") if is_package else module.split(".")[:-1]
                parent = parent[: len(parent) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module → the modules of ``package`` it imports (top-level, function-level and type-checking imports
    alike). A package's ``__init__`` importing its own submodules is how the package is assembled, not an edge."""
    modules = module_files(package)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = {resolve(name) for name in imported_names(tree, module, is_package=path.name == "__init__.py")}
        graph[module] = {t for t in targets if t and t != module and not t.startswith(module + ".")}
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` as ``[a, b, …, a]``, or ``[]`` when it has none."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        return list(reversed(error.args[1]))  # graphlib lists it against the edges' direction
    return []


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and "dmlstudy.experiments.compare" in graph
    cycle = import_cycle(graph)
    assert not cycle, "import cycle (function-level and TYPE_CHECKING imports included): " + " -> ".join(cycle)


def reachable(graph: dict[str, set[str]], module: str) -> set[str]:
    """Every module ``module`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_rows_of_the_comparison_sit_below_the_figures_tuning_and_the_experiments():
    """Row labels, styles and shared variants are read by plots, tuning and the study notebooks' helpers, so they
    import only the registry, and no helper of the comparison reaches the comparison's own config."""
    graph = import_graph(PACKAGE)
    assert graph["dmlstudy.rows"] == {"dmlstudy.methods"}
    assert "dmlstudy.rows" in graph["dmlstudy.plots"] & graph["dmlstudy.study.tuning"]
    helpers = ("tables", "rerank", "regime_comparison", "kit")
    for name in [
        *(f"dmlstudy.experiments.{name}" for name in helpers),
        "dmlstudy.findings.claims",
        "dmlstudy.run.protocol",
    ]:
        assert "dmlstudy.experiments.compare" not in reachable(graph, name), name


def test_the_study_reads_tuned_values_without_the_tuning_driver():
    """The protocol reads ``plans/tuned`` through :mod:`dmlstudy.run.tuned`, which imports neither Optuna nor the
    tuning driver; the driver writes the files through it."""
    graph = import_graph(PACKAGE)
    assert "dmlstudy.study.tuning" not in reachable(graph, "dmlstudy.run.protocol")
    assert "dmlstudy.run.tuned" in graph["dmlstudy.run.protocol"] & graph["dmlstudy.study.tuning"]
    path = PACKAGE / "run" / "tuned.py"
    names = imported_names(ast.parse(path.read_text(encoding="utf-8")), "dmlstudy.run.tuned", is_package=False)
    assert not {name for name in names if name.split(".")[0] == "optuna"}


def _package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, source in {"__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(source)
    return package


def test_a_cycle_closed_by_an_import_inside_a_function_is_found_and_named(tmp_path):
    package = _package(
        tmp_path,
        {
            "low.py": "def draw():\n    from pkg.high import label\n    return label\n",
            "high.py": "from pkg.low import draw\nlabel = 'x'\n",
            "side.py": "import numpy\nfrom pkg import low\n",
        },
    )
    graph = import_graph(package)
    assert graph == {"pkg": set(), "pkg.low": {"pkg.high"}, "pkg.high": {"pkg.low"}, "pkg.side": {"pkg", "pkg.low"}}
    cycle = import_cycle(graph)
    assert cycle in (["pkg.low", "pkg.high", "pkg.low"], ["pkg.high", "pkg.low", "pkg.high"])
    assert all(b in graph[a] for a, b in zip(cycle, cycle[1:]))  # in the direction of the imports


def test_a_cycle_closed_by_a_type_checking_import_is_found_and_package_assembly_is_not_one(tmp_path):
    package = _package(
        tmp_path,
        {
            "__init__.py": "from .high import Config\n",
            "low.py": (
                "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from .high import Config\nelse:\n    import json\n"
                "def rows(config: Config) -> list:\n    return config.methods\n"
            ),
            "high.py": "from . import low\nclass Config:\n    methods = []\n",
            "sub/__init__.py": "",
            "sub/deep.py": "from ..low import rows\n",
        },
    )
    graph = import_graph(package)
    assert graph == {
        "pkg": set(),  # __init__ assembling the package from its submodules
        "pkg.low": {"pkg.high"},  # the annotation-only import is an edge
        "pkg.high": {"pkg", "pkg.low"},
        "pkg.sub": set(),
        "pkg.sub.deep": {"pkg.low"},
    }
    assert import_cycle(graph) in (["pkg.low", "pkg.high", "pkg.low"], ["pkg.high", "pkg.low", "pkg.high"])


def dynamic_imports(package: Path) -> dict[str, list[int]]:
    """Module → the lines where it imports by a name computed at run time (``importlib.import_module``,
    ``__import__``): arrows the import graph cannot see."""
    found: dict[str, list[int]] = {}
    for module, path in module_files(package).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in ("import_module", "__import__"):
                    found.setdefault(module, []).append(node.lineno)
    return found


def test_no_module_imports_by_a_name_from_data():
    """Every arrow is an import statement the graph reads: measurements and notebook configs are registered by the
    modules that define them, never named as ``"module:function"`` strings. The one computed import left is the
    method registry's discovery: its own package's modules, and the plugin modules a person names in
    ``DMLSTUDY_METHOD_MODULES``."""
    assert set(dynamic_imports(PACKAGE)) == {"dmlstudy.methods"}


def test_a_computed_import_is_found(tmp_path):
    package = _package(tmp_path, {"low.py": "import importlib\nf = importlib.import_module('pkg.high').f\n"})
    assert dynamic_imports(package) == {"pkg.low": [2]}
