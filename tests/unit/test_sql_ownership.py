"""SQL lives only in the storage modules of ``shared/``: everything else calls them by name.

Every string literal of the production code (f-strings included) is checked for the shape of a SQL statement.
A statement found outside the modules below fails the test with its place, so a query written into a worker,
an adapter, the scheduler or a non-storage module of ``shared/`` is caught the day it is written. The ``kv``
table has one owner of its own: :mod:`shared.storage.kv`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = ("shared", "workers", "adapters", "scheduler")


def _in_storage(name: str) -> bool:
    return name.startswith("shared/storage/")


SQL = re.compile(
    r"\b(SELECT\b[\s\S]*\bFROM\b|INSERT\s+INTO\b|DELETE\s+FROM\b|UPDATE\s+[a-z_]+\s+SET\b|"
    r"CREATE\s+(TABLE|INDEX)\b|ALTER\s+TABLE\b|SET\s+TRANSACTION\b|PRAGMA\s+[a-z_]+)"
)
KV = re.compile(r"\b(FROM|INTO|UPDATE|JOIN)\s+kv\b")


def _literals(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string constant, with an f-string's literal parts joined (placeholders as ``?``)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "?" for v in node.values)
            found.append((node.lineno, str(text)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.append((node.lineno, node.value))
    return found


def _statements() -> list[tuple[str, int, str]]:
    out: list[tuple[str, int, str]] = []
    for package in PRODUCTION:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            for line, text in _literals(ast.parse(path.read_text(encoding="utf-8"))):
                if SQL.search(text) or KV.search(text):
                    out.append((name, line, " ".join(text.split())[:90]))
    return out


def test_sql_appears_only_in_the_storage_modules() -> None:
    outside = [f"{name}:{line}: {text}" for name, line, text in _statements() if not _in_storage(name)]
    assert outside == [], "SQL outside the storage modules:\n" + "\n".join(outside)


def test_only_the_kv_store_writes_statements_on_kv() -> None:
    # shared/storage/dialect.py reads the event log's prune mark inside the event INSERT itself (one statement).
    owners = {"shared/storage/kv.py", "shared/storage/dialect.py"}
    elsewhere = [
        f"{name}:{line}: {text}"
        for name, line, text in _statements()
        if KV.search(text) and name not in owners
    ]
    assert elsewhere == [], "kv statements outside shared/storage/kv.py:\n" + "\n".join(elsewhere)


def test_the_scan_finds_the_statements_it_is_meant_to_find() -> None:
    # The test above is only as good as its pattern: it must see the queue's own statements.
    found = {name for name, _line, _text in _statements()}
    assert {
        "shared/storage/queries/agent_leases.py",
        "shared/storage/kv.py",
        "shared/storage/db.py",
    } <= found
    samples = [
        "SELECT 1 FROM messages WHERE id = :i",
        "INSERT INTO kv (scope) VALUES (:s)",
        "UPDATE responses SET status = 'acked'",
        "DELETE FROM events WHERE id <= :b",
    ]
    assert all(SQL.search(s) for s in samples)
    assert not SQL.search("Select the agent from the list") and not SQL.search("update the settings")
