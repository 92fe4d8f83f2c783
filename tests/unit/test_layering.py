"""The package's layers import only downward, and no modules import each other in a cycle.

``layers`` -> ``ub`` -> ``ops`` -> ``buffers`` / ``gemm`` -> ``quantization`` -> ``comm`` ->
the native module and the base modules (errors, env, logging, launch, info, version). A module
may import its own package, any lower layer and the base; ``buffers`` and ``gemm`` sit side
by side and import neither each other. Every import counts, also those under
``TYPE_CHECKING`` and inside functions: a lazy import is still a dependency (docs/design.md §1).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "overlap"

# Rank of each part of the package; higher ranks may import lower ones.
RANKS = {
    "layers": 6,
    "ub": 5,
    "ops": 4,
    "buffers": 3,
    "gemm": 3,
    "quantization": 2,
    "comm": 1,
}
BASE = {"_native", "_logging", "_version", "errors", "env", "launch", "info", "dtypes", "_C"}


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        rel = p.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(path: Path, module: str) -> set[str]:
    """Every ``overlap.*`` module ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for a in node.names:
                # `from overlap import _C` names a module; `from overlap import initialize_ub`
                # names an attribute of the package facade.
                sub = f"{base}.{a.name}"
                found.add(sub if sub in MODULES or a.name == "_C" else base)
    return {m for m in found if m == "overlap" or m.startswith("overlap.")}


def _part(module: str) -> str:
    parts = module.split(".")
    return "overlap" if len(parts) == 1 else parts[1]


def test_imports_go_downward() -> None:
    modules = _modules()
    bad = []
    for name, path in modules.items():
        part = _part(name)
        if part == "overlap":
            continue  # the package facade re-exports from every layer
        rank = RANKS.get(part, 0)
        for dep in _imports(path, name):
            if dep not in modules and not dep.endswith("._C"):
                continue
            dpart = _part(dep)
            if dpart in (part, "overlap") and dep != "overlap":
                continue
            if dep == "overlap":
                bad.append(f"{name} imports the package facade 'overlap' (import a layer)")
                continue
            if dpart in BASE:
                continue
            drank = RANKS.get(dpart, 0)
            if drank >= rank:
                bad.append(f"{name} ({part}) imports {dep} ({dpart}): not a lower layer")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles() -> None:
    modules = _modules()
    graph = {
        name: {d for d in _imports(path, name) if d in modules and d != name}
        for name, path in modules.items()
    }
    # A package's __init__ re-exporting its modules is not a cycle with them.
    for name, deps in graph.items():
        graph[name] = {d for d in deps if not name.startswith(d + ".")}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_rank_table_knows_every_part() -> None:
    parts = {_part(m) for m in _modules()}
    unknown = parts - set(RANKS) - BASE - {"overlap"}
    assert not unknown, f"new parts of the package need a rank in RANKS: {sorted(unknown)}"


def test_gemm_does_not_import_quantization() -> None:
    # The GEMM and the quantization share ScalingMode and the FP8 dtype facts through the base
    # module overlap.dtypes, so that neither imports the other for them (docs/design.md §1.2).
    deps = _imports(MODULES["overlap.gemm"], "overlap.gemm")
    assert not {d for d in deps if _part(d) == "quantization"}, deps
