"""A status is named once: shared/storage/statuses.py declares the states of ``messages``, ``responses`` and
``pairings``, and the code and SQL elsewhere take them from there.

The production code is read with :mod:`ast`; a bare status string is one that stands for a row's state:
quoted in SQL (``status = 'pending'``), compared with something named ``status`` (``row["status"] ==
"acked"``, ``message.status in ("completed", "dead")``), assigned to a ``.status``, or the value of a
``"status"`` key. Words that only look like a state (a CLI command ``dead``, a table header ``pending``, a
platform's own ``failed``, the count fields of a report) are not states of our rows and pass.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.storage.statuses import MessageStatus, PairingStatus, ResponseStatus

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "workers", "adapters", "scheduler")
DECLARATION = Path("shared/storage/statuses.py")
STATES = frozenset(str(s) for machine in (MessageStatus, ResponseStatus, PairingStatus) for s in machine)
QUOTED = tuple(f"'{state}'" for state in STATES)
#: path -> source text of a comparison that looks like one of our states and is not, with why.
NOT_OURS: dict[str, dict[str, str]] = {
    "adapters/whatsapp.py": {
        'status.get("status") != "failed"': "a WhatsApp delivery receipt's own status, as Meta sends it",
    },
}


def _is_state(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in STATES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_state(e) for e in node.elts)
    return False


def _names_status(node: ast.expr) -> bool:
    return "status" in ast.unparse(node).lower()


def bare_statuses(root: Path) -> Iterator[str]:
    """``path:line: code`` of every bare status string in the production code under ``root``."""
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if rel == DECLARATION:
                continue
            source = path.read_text(encoding="utf-8")
            for node in ast.walk(ast.parse(source)):
                found: ast.AST | None = None
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if any(q in node.value for q in QUOTED):
                        found = node
                elif isinstance(node, ast.Compare):
                    operands = [node.left, *node.comparators]
                    if any(_names_status(o) for o in operands) and any(_is_state(o) for o in operands):
                        found = node
                elif isinstance(node, ast.Assign | ast.AnnAssign):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    status_target = any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets)
                    if status_target and node.value is not None and _is_state(node.value):
                        found = node
                elif isinstance(node, ast.Dict):
                    for key, value in zip(node.keys, node.values, strict=True):
                        if isinstance(key, ast.Constant) and key.value == "status" and _is_state(value):
                            found = node
                if found is not None:
                    code = ast.get_source_segment(source, found) or ""
                    if code not in NOT_OURS.get(rel.as_posix(), {}):
                        yield f"{rel}:{getattr(found, 'lineno', 0)}: {code}"


def test_no_bare_status_outside_the_declaration() -> None:
    found = sorted(set(bare_statuses(ROOT)))
    assert not found, (
        "use MessageStatus/ResponseStatus/PairingStatus from shared.storage.statuses:\n" + "\n".join(found)
    )


def test_the_scan_finds_each_kind_of_bare_status(tmp_path: Path) -> None:
    """The scan is not blind: each form it looks for, written bare, is reported (and the words that are not
    states are not)."""
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "sample.py").write_text(
        "SQL = \"SELECT * FROM messages WHERE status = 'dead'\"\n"
        'ok = row["status"] == "acked"\n'
        'done = message.status in ("completed", "dead")\n'
        'message.status = "processing"\n'
        'claimed = {"status": "pending"}\n'
        'fine = {"pending": 0, "label": "failed"}\n'
        'command = "dead"\n',
        encoding="utf-8",
    )
    lines = sorted(int(f.split(":")[1]) for f in set(bare_statuses(tmp_path)))
    assert lines == [1, 2, 3, 4, 5]


def test_every_state_is_a_plain_string_value() -> None:
    """Drivers store a member as its text and SQL built with an f-string reads the text itself."""
    assert f"status = '{MessageStatus.PENDING}'" == "status = 'pending'"
    assert {str(s) for s in ResponseStatus} == {"pending", "delivering", "acked", "failed"}
    assert {str(s) for s in MessageStatus} == {"pending", "processing", "completed", "dead"}
