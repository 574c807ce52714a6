"""The project's import graph (tests excluded) has no circle, and no file imports another's private names.

import-linter's contracts (pyproject.toml, `make lint`) hold the layers; a circle inside one layer, or
between modules no contract names, is caught here. `make lint` runs this file as a script.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
# Every top-level package of the project but the tests.
PACKAGES = (
    "agent",
    "bench",
    "cli",
    "cluster_app",
    "config",
    "infra",
    "notify_app",
    "profiles_app",
    "scheduler_app",
)


def import_graph() -> grimp.ImportGraph:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return grimp.build_graph(*PACKAGES, cache_dir=None)


def import_cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative), and
    the modules that import themselves: each is a circle of imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(imports):
        if start in index:
            continue
        work = [(start, iter(sorted(imports[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(imports.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in imports.get(node, ()):
                    cycles.append(sorted(component))
    return cycles


def private_imports() -> list[str]:
    """`from project.module import _name` (or of a project module's `_private` submodule from outside
    its package): what crosses files must have a public name."""
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            here = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.ImportFrom) or not node.module:
                    continue
                if node.module.split(".")[0] not in PACKAGES:
                    continue
                names = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                parts = node.module.split(".")
                private_module = next((i for i, p in enumerate(parts) if p.startswith("_")), None)
                # A package's private module may serve its own package (a package's `_helpers.py`, say).
                if private_module is not None and not here.startswith(".".join(parts[:private_module]) + "."):
                    names.append(node.module)
                found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names]
    return found


def test_a_circle_is_found_and_a_tree_is_not():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"a"}}) == [["a"]]
    assert import_cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_project_has_no_import_circle():
    graph = import_graph()
    imports = {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    assert import_cycles(imports) == []


def test_no_file_imports_another_files_private_names():
    assert private_imports() == []


if __name__ == "__main__":
    graph = import_graph()
    cycles = import_cycles({m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules})
    for cycle in cycles:
        print("import circle:", " <-> ".join(cycle))
    private = private_imports()
    for line in private:
        print("private import:", line)
    print(f"{len(graph.modules)} modules: {len(cycles)} import circles, {len(private)} private imports")
    sys.exit(1 if cycles or private else 0)
