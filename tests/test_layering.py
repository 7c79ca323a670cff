"""The library's layering, read from the source: which package may import which.

Every module under ``extensions/`` is parsed with ``ast`` (none is imported) and each import is
resolved to the module it loads, wherever it sits: at the top, inside a function (the library
imports lazily a lot) or under ``if TYPE_CHECKING:``. The rules:

- no import cycle between modules. Imports under ``TYPE_CHECKING`` never run, so they are left out
  of this rule only: they are how an annotation names a type without a runtime dependency;
- a package imports only from its own layer or a lower one (``LAYERS``, lowest first), type-only
  imports included: naming a higher layer's type is still depending on it;
- the code that runs beside the candidate (``verify/sandboxed/``) and the leaf modules both sides
  share (``verify/common/``) never import the trusted parent side (``verify/parent/``) or the
  verifier's public face; ``verify/common/`` imports nothing else of the verifier; the GPU timer
  (``timing/``) imports nothing of the verifier;
- no module sits loose in ``extensions/``: every module belongs to a package, so it has a layer.

The checker is tested on small synthetic trees too, so that each rule is seen to fail.
"""
from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest

ROOT = "extensions"
PROJECT_ROOT = Path(__file__).resolve().parents[1]

# Lowest first. A package may import from its own layer and the layers before it.
LAYERS: list[str] = [
    "config",      # typed config sections, YAML loading, CLI flags
    "runtime",     # run paths, checkpoints, locks, interrupts, atomic writes
    "timing",      # the GPU timer, which the verifier calls
    "verify",      # the verifier
    "prompting",   # prompt templates and verifier feedback
    "models",      # fetching and loading models; the tiny test model speaks the prompt template
    "generation",  # decoding and sampling
    "data",        # data preparation (verifies every pair)
    "export",      # merged export, model cards, the hub
    "training",    # SFT and RL; saving writes model cards, publishing goes through export
    "evaluation",  # evaluate.py
    "cloud",       # S3 sync and spot watching
    "pipeline",    # the stage table and the runner, on top of everything
]

VERIFY = f"{ROOT}.verify"
# The verifier's public face: what callers outside it import.
VERIFY_FACE = {VERIFY, f"{VERIFY}.api", f"{VERIFY}.cli", f"{VERIFY}.__main__"}
VERIFY_SUBPACKAGES = ("common", "parent", "sandboxed", "reference", "static")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module it loads
    line: int
    type_only: bool  # under `if TYPE_CHECKING:`

    def __str__(self) -> str:
        return f"{self.source} (line {self.line}) imports {self.target}"


@dataclass
class Tree:
    """The modules of one package tree, and the imports between them."""

    root: Path  # the folder holding the top package
    modules: dict[str, Path]  # dotted name -> file
    packages: set[str]  # dotted names of packages, with or without __init__.py
    imports: list[Import]

    def package_of(self, module: str) -> str:
        """The top-level package below ROOT a module belongs to ('' for ROOT itself and loose modules)."""
        parts = module.split(".")
        if len(parts) < 2 or (len(parts) == 2 and module not in self.packages and module in self.modules):
            return ""
        return parts[1]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement, however deeply nested, and whether only type checkers run it."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, type_only
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from _import_nodes(ast.Module(body=[child], type_ignores=[]), True)
            for child in node.orelse:
                yield from _import_nodes(ast.Module(body=[child], type_ignores=[]), type_only)
        else:
            yield from _import_nodes(node, type_only)


def scan(root: Path, top: str = ROOT) -> Tree:
    """Parse every module under ``root/top`` and resolve its imports of modules in that tree."""
    files = sorted((root / top).rglob("*.py"))
    modules = {module_name(path, root): path for path in files}
    packages = {".".join(d.relative_to(root).parts) for d in [root / top, *(root / top).rglob("*")] if d.is_dir()
                and d.name != "__pycache__"}
    tree = Tree(root, modules, packages, [])
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node, type_only in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            for target in _targets(node, name, is_package, modules, packages):
                if target != name and target.split(".")[0] == top:
                    tree.imports.append(Import(name, target, node.lineno, type_only))
    return tree


def _resolve_relative(module: Optional[str], level: int, importer: str, is_package: bool) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _loaded_module(dotted: str, modules: dict[str, Path], packages: set[str]) -> Optional[str]:
    """The module whose code runs for ``dotted``: itself, or the nearest enclosing module when the
    tail names an attribute; None for a namespace package (a folder without ``__init__.py``)."""
    parts = dotted.split(".")
    while parts:
        name = ".".join(parts)
        if name in modules:
            return name
        if name in packages:
            return None
        parts.pop()
    return None


def _targets(node: ast.stmt, importer: str, is_package: bool, modules: dict[str, Path],
             packages: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        found = [_loaded_module(alias.name, modules, packages) for alias in node.names]
        return [t for t in found if t]
    assert isinstance(node, ast.ImportFrom)
    base = _resolve_relative(node.module, node.level, importer, is_package)
    found = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in modules:
            found.append(submodule)  # `from package import module`
        else:
            found.append(_loaded_module(base, modules, packages))  # a name defined in `base`
    return sorted({t for t in found if t})


# --- the rules -------------------------------------------------------------------------------------


def loose_modules(tree: Tree) -> list[str]:
    return [f"{tree.modules[name].relative_to(tree.root)} sits directly in {ROOT}/; put it in a package"
            for name in sorted(tree.modules) if tree.package_of(name) == "" and name != ROOT]


def cycles(tree: Tree) -> list[str]:
    """One concrete cycle per strongly connected group of modules, runtime imports only."""
    graph: dict[str, dict[str, Import]] = {name: {} for name in tree.modules}
    for imp in tree.imports:
        if not imp.type_only:
            graph[imp.source].setdefault(imp.target, imp)
    found = []
    for group in _strongly_connected(graph):
        if len(group) < 2:
            continue
        path = _cycle_through(min(group), graph, group)
        found.append("import cycle: " + " -> ".join(str(imp) for imp in path))
    return found


def _strongly_connected(graph: dict[str, dict[str, Import]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (a deep chain of modules must not hit the recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph[succ]))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    groups.append(group)
    return groups


def _cycle_through(start: str, graph: dict[str, dict[str, Import]], group: set[str]) -> list[Import]:
    """The shortest path of imports from ``start`` back to itself inside ``group``."""
    came_by: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node]):
                if succ not in group:
                    continue
                if succ == start:
                    path = [graph[node][succ]]
                    while node != start:
                        path.append(came_by[node])
                        node = came_by[node].source
                    return path[::-1]
                if succ not in came_by:
                    came_by[succ] = graph[node][succ]
                    following.append(succ)
        frontier = following
    raise AssertionError(f"no cycle through {start}")


def upward_imports(tree: Tree, layers: list[str] = LAYERS) -> list[str]:
    rank = {package: i for i, package in enumerate(layers)}
    found = []
    packages = {tree.package_of(name) for name in tree.modules} - {""}
    for package in sorted(packages - set(rank)):
        found.append(f"package {ROOT}.{package} has no layer: add it to LAYERS in {Path(__file__).name}")
    for imp in tree.imports:
        source, target = tree.package_of(imp.source), tree.package_of(imp.target)
        if source in rank and target in rank and rank[target] > rank[source]:
            found.append(f"{imp}: layer {source!r} may not import from the higher layer {target!r}")
    return found


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def verifier_boundaries(tree: Tree) -> list[str]:
    found = []
    for imp in tree.imports:
        source, target = imp.source, imp.target
        candidate_side = _under(source, f"{VERIFY}.sandboxed") or _under(source, f"{VERIFY}.common")
        if candidate_side and (_under(target, f"{VERIFY}.parent") or target in VERIFY_FACE):
            found.append(f"{imp}: code beside the candidate may not import the trusted parent side "
                         "or the verifier's public face")
        elif (_under(source, f"{VERIFY}.common") and _under(target, VERIFY)
              and not _under(target, f"{VERIFY}.common")):
            found.append(f"{imp}: verify/common holds leaf modules and imports nothing else of the verifier")
        if _under(source, f"{ROOT}.timing") and _under(target, VERIFY):
            found.append(f"{imp}: the timer is a leaf below the verifier and may not import it")
    return found


def violations(tree: Tree, layers: list[str] = LAYERS) -> list[str]:
    return [*loose_modules(tree), *cycles(tree), *upward_imports(tree, layers), *verifier_boundaries(tree)]


# --- the project -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def project() -> Tree:
    return scan(PROJECT_ROOT)


def test_the_scan_sees_the_library(project):
    # Guards against a scan that finds nothing and so passes every rule.
    assert len(project.modules) > 100
    assert {"config", "verify", "training", "pipeline"} <= {project.package_of(m) for m in project.modules}
    assert any(imp.source == f"{ROOT}.training.rewards" and project.package_of(imp.target) == "verify"
               for imp in project.imports)


def test_no_module_sits_loose_in_extensions(project):
    assert loose_modules(project) == []


def test_no_import_cycles(project):
    assert cycles(project) == []


def test_packages_import_only_their_own_or_lower_layers(project):
    assert upward_imports(project) == []


def test_layers_name_each_package_once():
    assert len(LAYERS) == len(set(LAYERS))
    packages = {d.name for d in (PROJECT_ROOT / ROOT).iterdir() if d.is_dir() and d.name != "__pycache__"}
    assert set(LAYERS) == packages


def test_candidate_side_of_the_verifier_stays_apart_from_the_parent(project):
    assert verifier_boundaries(project) == []


# --- the checker, on synthetic trees ---------------------------------------------------------------


def make_tree(tmp_path: Path, files: dict[str, str]) -> Tree:
    for relative, source in {f"{ROOT}/__init__.py": "", **files}.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    return scan(tmp_path)


def test_checker_reports_a_cycle_through_a_lazy_import(tmp_path):
    tree = make_tree(tmp_path, {
        "extensions/config/__init__.py": "",
        "extensions/config/a.py": "from .b import thing\n",
        "extensions/config/b.py": "def thing():\n    from extensions.config import a\n",
    })
    [cycle] = cycles(tree)
    assert "extensions.config.a (line 1) imports extensions.config.b" in cycle
    assert "extensions.config.b (line 2) imports extensions.config.a" in cycle
    assert violations(tree, ["config"]) == [cycle]


def test_checker_leaves_type_only_imports_out_of_cycles_but_not_out_of_layers(tmp_path):
    tree = make_tree(tmp_path, {
        "extensions/config/__init__.py": "",
        "extensions/config/a.py": "from extensions.runtime.b import B\n",
        "extensions/runtime/__init__.py": "",
        "extensions/runtime/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..config.a import A\n",
    })
    assert cycles(tree) == []
    [upward] = upward_imports(tree, ["runtime", "config"])
    assert "extensions.runtime.b (line 3) imports extensions.config.a" in upward


def test_checker_reports_an_upward_import_with_module_and_line(tmp_path):
    tree = make_tree(tmp_path, {
        "extensions/config/__init__.py": "",
        "extensions/config/low.py": "import os\n\n\ndef late():\n    import extensions.pipeline.top\n",
        "extensions/pipeline/__init__.py": "",
        "extensions/pipeline/top.py": "from extensions.config import low\n",
    })
    assert upward_imports(tree, ["config", "pipeline"]) == [
        "extensions.config.low (line 5) imports extensions.pipeline.top: "
        "layer 'config' may not import from the higher layer 'pipeline'"]


def test_checker_wants_every_package_placed(tmp_path):
    tree = make_tree(tmp_path, {"extensions/config/a.py": "", "extensions/newcomer/b.py": ""})
    [missing] = upward_imports(tree, ["config"])
    assert "extensions.newcomer has no layer" in missing


def test_checker_reports_a_loose_module(tmp_path):
    tree = make_tree(tmp_path, {"extensions/config/__init__.py": "", "extensions/helpers.py": "X = 1\n"})
    assert loose_modules(tree) == [f"{Path(ROOT, 'helpers.py')} sits directly in {ROOT}/; put it in a package"]


def test_checker_reports_the_sandbox_importing_the_parent(tmp_path):
    tree = make_tree(tmp_path, {
        "extensions/verify/__init__.py": "",
        "extensions/verify/api.py": "",
        "extensions/verify/parent/judge.py": "SECRET = 1\n",
        "extensions/verify/sandboxed/worker.py": "def run():\n    from ..parent.judge import SECRET\n",
        "extensions/verify/common/leaf.py": "from extensions.verify import api\n",
        "extensions/verify/common/other.py": "from ..static import policy\n",
        "extensions/verify/static/policy.py": "",
        "extensions/timing/measure.py": "from extensions.verify.static.policy import *\n",
    })
    found = verifier_boundaries(tree)
    assert len(found) == 4, found
    assert any("extensions.verify.sandboxed.worker (line 2) imports extensions.verify.parent.judge" in f for f in found)
    assert any("extensions.verify.common.leaf (line 1) imports extensions.verify.api" in f for f in found)
    assert any("extensions.verify.common.other (line 1) imports extensions.verify.static.policy" in f
               for f in found)
    assert any("extensions.timing.measure (line 1) imports" in f and "timer" in f for f in found)


def test_checker_resolves_relative_and_package_imports(tmp_path):
    tree = make_tree(tmp_path, {
        "extensions/data/__init__.py": "from .pipeline import prepare\n",
        "extensions/data/pipeline.py": "from . import rejections as R\nfrom .. import config\n",
        "extensions/data/rejections.py": "",
        "extensions/config/__init__.py": "from .sections import A\n",
        "extensions/config/sections.py": "A = 1\n",
        "extensions/verify/common/leaf.py": "",
        "extensions/verify/parent/judge.py": "from ..common import leaf\nfrom ..common.leaf import x\n",
    })
    edges = {(imp.source, imp.target) for imp in tree.imports}
    assert edges == {
        ("extensions.data", "extensions.data.pipeline"),
        # `from . import module` loads the module, not the package's __init__ again.
        ("extensions.data.pipeline", "extensions.data.rejections"),
        ("extensions.data.pipeline", "extensions.config"),
        ("extensions.config", "extensions.config.sections"),
        # A folder without __init__.py runs no code of its own.
        ("extensions.verify.parent.judge", "extensions.verify.common.leaf"),
    }
