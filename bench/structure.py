"""The structure figures issue 40 sets targets for, read from the source (no process started).

    .venv/bin/python bench/structure.py            # a table; --json for the figures as JSON

- import cycles between production modules (``shared``, ``workers``, ``adapters``, ``scheduler``), counting
  imports inside functions: each strongly connected group of modules that import each other;
- SQL text outside ``shared/storage/``: string constants that read as a statement;
- chat platform modules that import the queue, storage or the runtime;
- classes with more than 20 methods, and modules over 600 lines.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared", "workers", "adapters", "scheduler")
PLATFORMS = (
    "adapters/telegram.py",
    "adapters/telegram_rate_limits.py",
    "adapters/discord.py",
    "adapters/discord_catch_up.py",
    "adapters/discord_questions.py",
    "adapters/whatsapp.py",
    "adapters/whatsapp_graph.py",
    "adapters/whatsapp_media.py",
)
PLATFORM_FORBIDDEN = ("shared.queue", "shared.storage", "shared.runtime")
SQL = re.compile(
    r"^\s*(SELECT\s.+\sFROM|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+(TABLE|INDEX|UNIQUE))\b",
    re.IGNORECASE | re.DOTALL,
)
MAX_METHODS = 20
MAX_LINES = 600


def modules() -> dict[str, Path]:
    """Dotted module name → file, for every production module."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(tree: ast.Module, name: str, known: dict[str, Path]) -> set[str]:
    """The production modules ``name`` imports, anywhere in it (functions included)."""
    package = name if known[name].name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    return sorted(groups, key=len, reverse=True)


def sql_outside_storage(trees: dict[str, ast.Module], known: dict[str, Path]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, tree in trees.items():
        if name.startswith("shared.storage"):
            continue
        parts = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
        for node in ast.walk(tree):
            if id(node) in parts:
                continue  # counted with its f-string
            if isinstance(node, ast.JoinedStr):  # an f-string: its literal parts, the splices as "x"
                text = "".join(v.value if isinstance(v, ast.Constant) else "x" for v in node.values)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            else:
                continue
            if SQL.match(str(text)):
                rel = str(known[name].relative_to(ROOT))
                counts[rel] = counts.get(rel, 0) + 1
    return counts


def big_classes(trees: dict[str, ast.Module], known: dict[str, Path]) -> list[tuple[str, int]]:
    found = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                methods = [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
                if len(methods) > MAX_METHODS:
                    found.append((f"{known[name].relative_to(ROOT)}:{node.name}", len(methods)))
    return sorted(found, key=lambda item: -item[1])


def report() -> dict[str, object]:
    known = modules()
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in known.items()}
    graph = {name: imported(tree, name, known) for name, tree in trees.items()}
    platform_imports = {
        rel: sorted(m for m in graph[_name(rel)] if m.startswith(PLATFORM_FORBIDDEN))
        for rel in PLATFORMS
        if (ROOT / rel).exists()
    }
    sql = sql_outside_storage(trees, known)
    long_modules = sorted(
        (
            (str(p.relative_to(ROOT)), n)
            for p in known.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES
        ),
        key=lambda item: -item[1],
    )
    return {
        "modules": len(known),
        "import_cycles": cycles(graph),
        "sql_statements_outside_storage": sum(sql.values()),
        "sql_files_outside_storage": sql,
        "platform_modules_importing_queue_storage_runtime": {k: v for k, v in platform_imports.items() if v},
        "classes_over_20_methods": big_classes(trees, known),
        "modules_over_600_lines": long_modules,
    }


def _name(rel: str) -> str:
    return rel.removesuffix(".py").replace("/", ".")


def _lines(figures: dict[str, object]) -> Iterable[str]:
    groups = figures["import_cycles"]
    assert isinstance(groups, list)
    yield f"production modules: {figures['modules']}"
    yield f"import cycles (functions' imports counted): {len(groups)} groups, {sum(len(g) for g in groups)} modules"
    for group in groups:
        yield f"  {len(group)}: {', '.join(group)}"
    sql = figures["sql_files_outside_storage"]
    assert isinstance(sql, dict)
    yield f"SQL statements outside shared/storage: {figures['sql_statements_outside_storage']} in {len(sql)} files"
    for rel, count in sorted(sql.items(), key=lambda item: -item[1]):
        yield f"  {count:3d}  {rel}"
    platforms = figures["platform_modules_importing_queue_storage_runtime"]
    assert isinstance(platforms, dict)
    yield f"platform modules importing the queue, storage or runtime: {len(platforms)}"
    for rel, names in platforms.items():
        yield f"  {rel}: {', '.join(names)}"
    classes = figures["classes_over_20_methods"]
    assert isinstance(classes, list)
    yield f"classes over {MAX_METHODS} methods: {len(classes)}"
    for where, count in classes:
        yield f"  {count:3d}  {where}"
    long_modules = figures["modules_over_600_lines"]
    assert isinstance(long_modules, list)
    yield f"modules over {MAX_LINES} lines: {len(long_modules)}"
    for rel, count in long_modules:
        yield f"  {count:4d}  {rel}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    figures = report()
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print("\n".join(_lines(figures)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
