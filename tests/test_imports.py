"""The package's import graph has no cycles, between modules or between packages, counting the
imports inside functions too (a lazy import hides a cycle from Python, not from a reader); the
choice enums and the schemas import without Hydra."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "dlrm_cache"


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for p in root.rglob("*.py"):
        name = ".".join(p.relative_to(root.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the package's modules it imports (anywhere in its source)."""
    mods = _modules(root)
    top = root.name

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        pkg = m if path.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names
                ]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for t in targets:
                found = owner(t) if t.split(".")[0] == top else None
                if found and found != m:
                    edges[m].add(found)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(n: str) -> None:
        index[n] = low[n] = len(index)
        stack.append(n)
        for w in graph.get(n, ()):
            if w not in index:
                visit(w)
                low[n] = min(low[n], low[w])
            elif w in stack:
                low[n] = min(low[n], index[w])
        if low[n] == index[n]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == n:
                    break
            if len(comp) > 1:
                out.append(comp)

    for n in list(graph):
        if n not in index:
            visit(n)
    return out


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """dlrm_cache.data.loader -> dlrm_cache.data: edges between top-level modules and packages."""

    def unit(m: str) -> str:
        return ".".join(m.split(".")[:2])

    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        for t in targets:
            if unit(m) != unit(t):
                out.setdefault(unit(m), set()).add(unit(t))
    return out


def test_no_import_cycles() -> None:
    graph = import_graph()
    assert cycles(graph) == []
    assert cycles(package_graph(graph)) == []


# The package's folders (and root modules), bottom layer first: a module may import its own folder
# and the layers below it, never a layer above nor a folder beside it on its own layer.  Each
# folder's ``__init__`` docstring says the same in words.
LAYERS: list[set[str]] = [
    {"dlrm_cache", "config", "console", "concurrency", "files"},
    {"embedding", "plots"},
    {"model", "parallel", "rundir"},
    {"data"},
    {"train"},
    {"bench", "report", "after"},
    {"commands"},
    {"cli"},
    {"__main__"},
]


def _layer(unit: str) -> int:
    name = unit.removeprefix("dlrm_cache.") if unit != "dlrm_cache" else unit
    found = [i for i, names in enumerate(LAYERS) if name in names]
    assert found, f"{unit}: a folder or root module missing from LAYERS"
    return found[0]


def test_imports_run_down_the_layers() -> None:
    graph = package_graph(import_graph())
    units = {".".join(m.split(".")[:2]) for m in _modules(PACKAGE)}
    for unit in units:
        _layer(unit)
    upward = sorted(
        f"{src} -> {dst}"
        for src, dsts in graph.items()
        for dst in dsts
        if _layer(src) <= _layer(dst)
    )
    assert upward == []


def test_every_folder_says_what_it_holds() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        if init.parent == PACKAGE:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc and len(doc.splitlines()) >= 2, f"{init}: no docstring of a few lines"


def test_the_package_root_holds_few_modules() -> None:
    assert len(list(PACKAGE.glob("*.py"))) <= 8


def test_no_module_over_400_lines() -> None:
    long = [
        f"{p.relative_to(REPO)}: {n}"
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    ]
    assert long == []


def test_the_check_finds_a_cycle_through_a_lazy_import(tmp_path: Path) -> None:
    """The shape the package had: report imported figures inside a function, figures imported
    report at the top; and config registering data's schemas while data imported config."""
    pkg = tmp_path / "pkg"
    (pkg / "data").mkdir(parents=True)
    for name, text in {
        "__init__.py": "",
        "report.py": "def draw():\n    from .figures import plot\n",
        "figures.py": "from .report import Panel\n",
        "config.py": "def register():\n    from .data.config import X\n",
        "data/__init__.py": "",
        "data/config.py": "",
        "data/synth.py": "from ..config import config_dict\n",
    }.items():
        (pkg / name).write_text(text)
    graph = import_graph(pkg)
    assert cycles(graph) == [{"pkg.report", "pkg.figures"}]
    assert sorted(map(sorted, cycles(package_graph(graph)))) == [
        ["pkg.config", "pkg.data"],
        ["pkg.figures", "pkg.report"],
    ]


def test_choices_and_schemas_import_without_hydra() -> None:
    code = (
        "import sys, dlrm_cache.config.choices, dlrm_cache.config.schemas, dlrm_cache.model.dlrm; "
        "print('hydra' in sys.modules)"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert res.stdout.strip() == "False", res.stderr


def test_the_dispatcher_starts_without_torch() -> None:
    """Every command line (``--help``, a refused override, every CLI test's child process) pays
    the dispatcher's imports: the schemas it registers must not pull in torch or torchrec (2.3 s
    of a 2.7 s start when ``verify``'s schema brought the loader in)."""
    code = (
        "import sys, dlrm_cache.cli, dlrm_cache.commands.store; "
        "print(sorted(m for m in ('torch', 'torchrec', 'fbgemm_gpu') if m in sys.modules))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert res.stdout.strip() == "[]", res.stdout + res.stderr
