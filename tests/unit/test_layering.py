"""Which part of the code may import which: the folder tree of ``shared/`` is its architecture.

Every import of the production code is read with :mod:`ast` (imports inside functions and under
``TYPE_CHECKING`` included) and checked against the rules each ``shared/`` folder's docstring states:

- a *unit* is a folder of ``shared/`` (``storage``, ``queue``, …) or a module directly in ``shared/``; each
  unit may import only the units :data:`ALLOWED` names for it, and the rules form layers (no cycle);
- ``shared`` imports none of the process packages, and the process packages (``workers``, ``adapters``,
  ``scheduler``) never import each other: they meet only in the database;
- the process packages never import ``shared.storage.kv``: what they keep in the ``kv`` table goes through a
  small named store of ``shared/`` that owns its scope and key format (``shared/chat/``, ``shared/queue/``),
  so a scope is written and read in one place (``shared.storage.db`` for the ``Database``/``Tx`` types stays
  allowed);
- a new module directly in ``shared/`` or a new folder fails until it is given a place here, which also keeps
  the number of modules directly in ``shared/`` small.

An import that has to cross the layers is listed in :data:`EXCEPTIONS` with why (none today); the list may
only shrink (an exception no longer used fails too, so it is removed with the import).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PROCESS_PACKAGES = ("workers", "adapters", "scheduler")

#: Plain values and helpers every layer may use; they import nothing of ``shared``.
VALUES = frozenset(
    {
        "aio",
        "backoff",
        "clock",
        "ids",
        "inbound_media",
        "notices",
        "private_files",
        "port_owner",
        "safe_files",
        "worker_identity",
    }
)

_STORAGE = VALUES | {"storage"}
_EVENTS = _STORAGE | {"settings", "events"}
_CHAT = _EVENTS | {"chat"}
_QUEUE = _CHAT | {"chain_budget", "queue"}
_READS = _QUEUE | {"reads"}

#: unit -> the units it may import (itself always included).
ALLOWED: dict[str, frozenset[str]] = {
    **{value: frozenset({value}) for value in VALUES},
    "storage": _STORAGE,
    "settings": VALUES | {"settings"},
    "chain_budget": _STORAGE | {"chain_budget"},
    "file_access": VALUES | {"settings", "chat", "file_access"},
    "events": _EVENTS,
    "chat": _CHAT,
    "queue": _QUEUE,
    "reads": _READS,
    "runtime": _READS | {"file_access", "runtime"},
    "cli": _READS | {"file_access", "runtime", "cli"},
}

#: (importing file, imported module): the imports that cross the layers today, for the refactors to remove.
EXCEPTIONS: dict[tuple[str, str], str] = {}

#: The module the process packages may not import: the ``kv`` table is reached through the stores of shared/.
KV_MODULE = "shared.storage.kv"


def _sources(root: Path, package: str) -> Iterator[Path]:
    yield from sorted((root / package).rglob("*.py"))


def _imports(root: Path, path: Path) -> Iterator[tuple[int, str]]:
    """Every module ``path`` imports, absolute (``from shared import kv`` gives ``shared.kv``)."""
    package = path.relative_to(root).parts[:-1]
    folders = {"shared", *(f"shared.{p.parent.name}" for p in (root / "shared").glob("*/__init__.py"))}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            for alias in node.names:
                # ``from shared import kv`` names a module; ``from shared.kv import Scope`` a name in one.
                yield node.lineno, f"{base}.{alias.name}" if base in folders else base


def _unit(module: str) -> str | None:
    """The unit of ``shared.queue.core`` is ``queue``; of ``shared.clock``, ``clock``; None outside shared."""
    parts = module.split(".")
    return parts[1] if parts[0] == "shared" and len(parts) > 1 else None


def _edges(root: Path = ROOT) -> Iterator[tuple[str, int, str, str]]:
    """(file, line, its unit, imported module) for every import of another unit of ``shared``."""
    for path in _sources(root, "shared"):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[1] == "__init__":
            continue
        for line, module in _imports(root, path):
            target = _unit(module)
            if target is not None and target != parts[1]:
                yield path.relative_to(root).as_posix(), line, parts[1], module


def _crossing(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file, line, imported module) for every import its unit's rules do not allow."""
    return [
        (name, line, module)
        for name, line, unit, module in _edges(root)
        if _unit(module) not in ALLOWED[unit]
    ]


def _excepted(name: str, module: str) -> bool:
    return any(
        name == file and (module == target or module.startswith(target + ".")) for file, target in EXCEPTIONS
    )


def test_every_unit_of_shared_has_a_place() -> None:
    units = {p.stem for p in (ROOT / "shared").glob("*.py") if p.stem != "__init__"}
    units |= {p.name for p in (ROOT / "shared").iterdir() if (p / "__init__.py").exists()}
    assert sorted(units - set(ALLOWED)) == [], "give the new module or folder a place in ALLOWED"
    assert sorted(set(ALLOWED) - units) == [], "a unit in ALLOWED no longer exists"
    modules = [p for p in (ROOT / "shared").glob("*.py") if p.stem != "__init__"]
    assert len(modules) <= 15, "directly in shared/ stay the few modules that belong to no folder"


def test_the_rules_form_layers() -> None:
    """No two units may import each other, directly or round about."""
    done: set[str] = set()

    def visit(unit: str, path: tuple[str, ...]) -> None:
        assert unit not in path, f"import rules go round: {' -> '.join((*path, unit))}"
        if unit in done:
            return
        for other in ALLOWED[unit] - {unit}:
            visit(other, (*path, unit))
        done.add(unit)

    for unit in ALLOWED:
        visit(unit, ())


def test_each_folder_of_shared_imports_only_what_its_rules_allow() -> None:
    wrong = [
        f"{name}:{line} imports {module}" for name, line, module in _crossing() if not _excepted(name, module)
    ]
    assert wrong == [], "imports against the layers of shared/ (see each folder's docstring):\n" + "\n".join(
        wrong
    )


def test_every_exception_is_still_used() -> None:
    crossing = _crossing()
    stale = [
        f"{file} -> {target}"
        for file, target in EXCEPTIONS
        if not any(name == file and module.startswith(target) for name, _line, module in crossing)
    ]
    assert stale == [], "remove these from EXCEPTIONS, the import is gone:\n" + "\n".join(stale)


def test_shared_imports_no_process_package_and_those_do_not_import_each_other() -> None:
    wrong: list[str] = []
    for package in ("shared", *PROCESS_PACKAGES):
        others = {p for p in PROCESS_PACKAGES if p != package}
        for path in _sources(ROOT, package):
            for line, module in _imports(ROOT, path):
                if module.split(".")[0] in others:
                    wrong.append(f"{path.relative_to(ROOT).as_posix()}:{line} imports {module}")
    assert wrong == [], "processes meet only in the database:\n" + "\n".join(wrong)


def _kv_imports(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file, line, imported module) for every import of :data:`KV_MODULE` (or a name in it) in the process
    packages, once per line (``from shared.storage.kv import Scope, scoped`` is one import)."""
    found = (
        (path.relative_to(root).as_posix(), line, module)
        for package in PROCESS_PACKAGES
        for path in _sources(root, package)
        for line, module in _imports(root, path)
        if module == KV_MODULE or module.startswith(KV_MODULE + ".")
    )
    return list(dict.fromkeys(found))


def test_process_packages_reach_kv_only_through_the_stores_of_shared() -> None:
    wrong = [f"{name}:{line} imports {module}" for name, line, module in _kv_imports()]
    assert wrong == [], (
        "keep the value through a named store of shared/ (shared/chat/ or shared/queue/) that owns its kv "
        "scope, not shared.storage.kv:\n" + "\n".join(wrong)
    )


def test_a_kv_import_in_a_process_package_is_caught(tmp_path: Path) -> None:
    """The kv rule itself, on a small tree: every spelling of an import of the kv module in each process
    package is reported; the storage types (``db``) and a store of ``shared/chat/`` are not."""
    for folder in ("storage", "chat"):
        (tmp_path / "shared" / folder).mkdir(parents=True)
        (tmp_path / "shared" / folder / "__init__.py").write_text('"""A folder."""\n', encoding="utf-8")
    sources = {
        "workers/run.py": "from shared.storage import kv\nfrom shared.storage.db import Database\n",
        "adapters/intake.py": "from shared.storage import db\nfrom shared.storage.kv import Scope, scoped\n",
        "scheduler/dlq.py": "from shared.chat import held\nimport shared.storage.kv\n",
    }
    for name, text in sources.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    assert _kv_imports(tmp_path) == [
        ("workers/run.py", 1, "shared.storage.kv"),
        ("adapters/intake.py", 2, "shared.storage.kv"),
        ("scheduler/dlq.py", 2, "shared.storage.kv"),
    ]


def test_a_wrong_import_is_caught(tmp_path: Path) -> None:
    """The checker itself, on a small tree: storage importing the queue is reported, in any spelling, and
    storage importing a plain value is not."""
    for folder in ("storage", "queue"):
        (tmp_path / "shared" / folder).mkdir(parents=True)
        (tmp_path / "shared" / folder / "__init__.py").write_text('"""A folder."""\n', encoding="utf-8")
    (tmp_path / "shared" / "storage" / "db.py").write_text(
        "from shared.clock import now_ms\nfrom shared.queue.core import Queue\n"
        "from shared.queue import leases\nfrom ..queue import admin\n",
        encoding="utf-8",
    )
    assert _crossing(tmp_path) == [
        ("shared/storage/db.py", 2, "shared.queue.core"),
        ("shared/storage/db.py", 3, "shared.queue.leases"),
        ("shared/storage/db.py", 4, "shared.queue.admin"),
    ]
