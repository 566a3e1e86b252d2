"""Layers only run down: no module of ``mmtf/`` imports from a higher layer, no package cycles.

The layer table is read from ``docs/design/layers.md`` (the one place it is written). Every
import counts, including those inside functions; those under ``if TYPE_CHECKING:`` do not.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS_DOC = ROOT / "docs" / "design" / "layers.md"


@dataclass(frozen=True)
class Edge:
    """One import: ``source`` (file:line) imports ``target`` from module ``importer``."""

    file: Path
    line: int
    importer: str
    target: str


def read_layers(doc: Path = LAYERS_DOC) -> dict[str, int]:
    """``{module prefix: layer}`` from the doc's fenced block marked ``layers``."""
    match = re.search(r"```layers\n(.*?)```", doc.read_text(), re.S)
    if not match:
        raise AssertionError(f"{doc}: no ```layers block")
    table: dict[str, int] = {}
    for row in match.group(1).strip().splitlines():
        level, *prefixes = row.split()
        for prefix in prefixes:
            if prefix in table:
                raise AssertionError(f"{doc}: {prefix} is listed in layers {table[prefix]} and {level}")
            table[prefix] = int(level)
    return table


def module_name(path: Path, package_root: Path) -> str:
    parts = list(path.relative_to(package_root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imports_of(package_root: Path) -> list[Edge]:
    """Every import of a module of the package at ``package_root`` by one of its modules."""
    top = package_root.name
    edges = []
    for path in sorted(package_root.rglob("*.py")):
        importer = module_name(path, package_root)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        skip = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = importer.split(".") if is_package else importer.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                # `from pkg import name` may import a submodule: count both readings.
                targets = [module, *(f"{module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                if target == top or target.startswith(top + "."):
                    edges.append(Edge(path, node.lineno, importer, target))
    return edges


def layer_of(module: str, table: dict[str, int]) -> tuple[str, int] | None:
    """The longest prefix of ``module`` in ``table`` and its layer (None: not placed)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in table:
            return prefix, table[prefix]
    return None


def _is_module(name: str, modules: set[str]) -> bool:
    return name in modules


def layering_violations(package_root: Path, table: dict[str, int]) -> list[str]:
    """One line per upward import or unplaced module, naming file:line, modules and layers."""
    modules = {module_name(p, package_root) for p in package_root.rglob("*.py")}
    problems = [f"{m}: in no layer of {LAYERS_DOC.name}; add its package (or it) to a row"
                for m in sorted(modules) if layer_of(m, table) is None]
    seen: set[tuple[Path, int, str]] = set()
    for edge in imports_of(package_root):
        if not _is_module(edge.target, modules):
            continue                              # `from pkg import name`: name is not a module
        src, dst = layer_of(edge.importer, table), layer_of(edge.target, table)
        if src is None or dst is None or (edge.file, edge.line, dst[0]) in seen:
            continue                              # unplaced (reported above), or said already
        seen.add((edge.file, edge.line, dst[0]))
        if dst[1] > src[1]:
            problems.append(f"{edge.file.relative_to(package_root.parent)}:{edge.line}: "
                            f"{edge.importer} (layer {src[1]}, {src[0]}) imports {edge.target} "
                            f"(layer {dst[1]}, {dst[0]}): layers only run down")
    return problems


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of two or more nodes that reach each other (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def package_cycles(package_root: Path, table: dict[str, int]) -> list[list[str]]:
    """Groups of rows of the table (packages) that import each other, directly or not."""
    modules = {module_name(p, package_root) for p in package_root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for edge in imports_of(package_root):
        if not _is_module(edge.target, modules):
            continue
        src, dst = layer_of(edge.importer, table), layer_of(edge.target, table)
        if src and dst and src[0] != dst[0]:
            graph.setdefault(src[0], set()).add(dst[0])
    return strongly_connected(graph)


def test_no_module_imports_from_a_higher_layer():
    problems = layering_violations(ROOT / "mmtf", read_layers())
    assert not problems, "\n".join(problems)


def test_no_package_cycles():
    cycles = package_cycles(ROOT / "mmtf", read_layers())
    assert not cycles, f"package cycles: {cycles}"


def test_every_layer_row_names_a_real_module():
    modules = {module_name(p, ROOT / "mmtf") for p in (ROOT / "mmtf").rglob("*.py")}
    stale = [prefix for prefix in read_layers() if prefix not in modules]
    assert not stale, f"{LAYERS_DOC.name} names modules that do not exist: {stale}"


# --------------------------------------------------------------- the checker itself can fail
def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, body in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(body))
    return root


TABLE = {"pkg": 2, "pkg.low": 0, "pkg.high": 1}


def test_a_planted_upward_import_inside_a_function_is_named_with_file_and_line(tmp_path):
    root = _plant(tmp_path, {"__init__.py": "", "low/__init__.py": "", "high/__init__.py": "",
                             "high/top.py": "X = 1\n",
                             "low/leaf.py": """\
                                 import os


                                 def f():
                                     from pkg.high.top import X
                                     return X
                                 """})
    problems = layering_violations(root, TABLE)
    assert problems == ["pkg/low/leaf.py:5: pkg.low.leaf (layer 0, pkg.low) imports "
                        "pkg.high.top (layer 1, pkg.high): layers only run down"]


def test_relative_and_from_package_imports_resolve_to_modules(tmp_path):
    root = _plant(tmp_path, {"__init__.py": "", "low/__init__.py": "from ..high import top\n",
                             "high/__init__.py": "", "high/top.py": "X = 1\n"})
    assert [p.split(": ", 1)[0] for p in layering_violations(root, TABLE)] == ["pkg/low/__init__.py:1"]


def test_type_checking_imports_do_not_count_and_downward_ones_pass(tmp_path):
    root = _plant(tmp_path, {"__init__.py": "", "low/__init__.py": "", "high/__init__.py": "",
                             "high/top.py": "from pkg.low import leaf\n",
                             "low/leaf.py": """\
                                 from typing import TYPE_CHECKING
                                 if TYPE_CHECKING:
                                     from pkg.high.top import X
                                 """})
    assert layering_violations(root, TABLE) == []


def test_a_module_in_no_layer_and_a_cycle_within_a_layer_are_reported(tmp_path):
    root = _plant(tmp_path, {"__init__.py": "", "a/__init__.py": "from pkg.b import y\n",
                             "b/__init__.py": "def y():\n    from pkg.a import x\n",
                             "a/x.py": "", "c.py": ""})
    table = {"pkg.a": 0, "pkg.b": 0}
    assert layering_violations(root, table) == [
        f"{m}: in no layer of {LAYERS_DOC.name}; add its package (or it) to a row"
        for m in ("pkg", "pkg.c")]
    assert package_cycles(root, table) == [["pkg.a", "pkg.b"]]


def test_the_table_refuses_a_module_in_two_layers(tmp_path):
    doc = tmp_path / "layers.md"
    doc.write_text("```layers\n0 mmtf.a\n1 mmtf.b mmtf.a\n```\n")
    with pytest.raises(AssertionError, match=r"mmtf.a is listed in layers 0 and 1"):
        read_layers(doc)


# --------------------------------------------------------------- file cycles, type-only imports
def file_cycles(package_root: Path, table: dict[str, int]) -> list[list[str]]:
    """Groups of modules (files, not ``__init__``) of one row of the table that import each
    other, directly or not. Imports inside functions count, as for the layers: two files that
    need each other hold one idea (or one of them is half-initialised when the other runs)."""
    modules = {module_name(p, package_root) for p in package_root.rglob("*.py")
               if p.name != "__init__.py"}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for edge in imports_of(package_root):
        src = edge.importer
        if (src in modules and edge.target in modules and edge.target != src
                and layer_of(src, table) == layer_of(edge.target, table)):
            graph[src].add(edge.target)
    return strongly_connected(graph)


def _annotation_nodes(tree: ast.AST) -> set[int]:
    """ids of every node inside an annotation (arguments, returns, annotated assignments)."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns:
            roots.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            roots.append(node.annotation)
    return {id(n) for root in roots for n in ast.walk(root)}


def type_only_uses(package_root: Path, table: dict[str, int]) -> list[str]:
    """One line per name imported only under ``if TYPE_CHECKING:`` that the module uses at run
    time: the name itself outside annotations with no import that runs (a NameError), or,
    for a name from a higher layer, a parameter annotated with it that is called or whose
    attributes are read (the module runs that layer's code, which the layer check cannot
    see: a type-only import hides the upward dependency)."""
    problems = []
    for path in sorted(package_root.rglob("*.py")):
        importer = module_name(path, package_root)
        tree = ast.parse(path.read_text(), filename=str(path))
        skip = _type_checking_nodes(tree)
        names: dict[str, str] = {}
        upward: set[str] = set()
        bound_at_run_time: set[str] = set()
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom | ast.Import):
                continue
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                if id(node) not in skip:
                    bound_at_run_time.add(bound)
                    continue
                module = getattr(node, "module", None) or alias.name
                names[bound] = f"{module}.{alias.name}" if module != alias.name else module
                src, dst = layer_of(importer, table), layer_of(module, table)
                if src and dst and dst[1] > src[1]:
                    upward.add(bound)
        if not names:
            continue
        annotations = _annotation_nodes(tree)
        where = path.relative_to(package_root.parent)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Name) and node.id in names and id(node) not in skip
                    and node.id not in bound_at_run_time
                    and id(node) not in annotations and isinstance(node.ctx, ast.Load)):
                problems.append(f"{where}:{node.lineno}: {node.id} ({names[node.id]}) is "
                                f"imported under TYPE_CHECKING but used at run time")
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            typed = {a.arg: name for a in [*node.args.args, *node.args.kwonlyargs]
                     if a.annotation is not None
                     for name in upward
                     if any(isinstance(n, ast.Name) and n.id == name
                            for n in ast.walk(a.annotation))}
            for use in ast.walk(node):
                target = use.value if isinstance(use, ast.Attribute) else \
                    use.func if isinstance(use, ast.Call) else None
                if isinstance(target, ast.Name) and target.id in typed:
                    name = typed[target.id]
                    problems.append(f"{where}:{use.lineno}: {node.name}() runs {target.id} "
                                    f"({name}: {names[name]}, imported under TYPE_CHECKING); "
                                    f"import it for real (a layer below) or move the code up")
                    break
    return problems


def test_no_import_cycle_between_files_of_a_package():
    cycles = file_cycles(ROOT / "mmtf", read_layers())
    assert cycles == [], f"file import cycles: {cycles}"


def test_no_type_only_import_is_used_at_run_time():
    problems = type_only_uses(ROOT / "mmtf", read_layers())
    assert not problems, "\n".join(problems)


def test_planted_file_cycles_are_reported_also_through_functions(tmp_path):
    root = _plant(tmp_path, {"__init__.py": "", "low/__init__.py": "from pkg.low import a\n",
                             "low/a.py": "from pkg.low.b import y\nx = 1\n",
                             "low/b.py": "import pkg.low.a\ny = 2\n",
                             "low/c.py": "from pkg.low.a import x\nfrom pkg.low import d\n",
                             "low/d.py": "def f():\n    from pkg.low.c import x\n",
                             "low/e.py": "from pkg.low import a\n",
                             "high/__init__.py": "", "high/top.py": "from pkg.low.e import a\n"})
    assert file_cycles(root, TABLE) == [["pkg.low.a", "pkg.low.b"], ["pkg.low.c", "pkg.low.d"]]


def test_a_planted_type_only_import_used_at_run_time_is_reported(tmp_path):
    body = """\
        from __future__ import annotations
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from pkg.high.top import Task, Other


        def annotated_only(task: Task | None) -> Other:
            return None


        def calls(task: Task, n: int) -> list:
            return task.predict_batch(n)


        def builds() -> Other:
            return Other()
        """
    root = _plant(tmp_path, {"__init__.py": "", "low/__init__.py": "", "low/leaf.py": body,
                             "low/down.py": body.replace("pkg.high.top", "pkg.low.leaf")
                                                .replace("return Other()", "return None"),
                             "high/__init__.py": "", "high/top.py": ""})
    assert type_only_uses(root, TABLE) == [
        "pkg/low/leaf.py:12: calls() runs task (Task: pkg.high.top.Task, imported under "
        "TYPE_CHECKING); import it for real (a layer below) or move the code up",
        "pkg/low/leaf.py:16: Other (pkg.high.top.Other) is imported under TYPE_CHECKING but "
        "used at run time"]
