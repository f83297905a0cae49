"""The channel seam (adapters/platform.py): a platform plugin knows only the seam, never the runner's parts.

A plugin that reached into the intake, the delivery or the lifecycle would make the runner's parts part of
the plugin interface again (the mixins issue 26 removed). Read with :mod:`ast`, like the layering test.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = (
    "telegram.py",
    "telegram_rate_limits.py",
    "discord.py",
    "discord_catch_up.py",
    "discord_questions.py",
    "whatsapp.py",
    "whatsapp_graph.py",
    "whatsapp_media.py",
    "slack.py",
    "slack_events.py",
    "slack_intake.py",
    "chat_turns.py",
)
#: The channel runner's parts: the runner builds them and hands the platform its intake as ``inbox``.
RUNNER_PARTS = frozenset(
    {
        "adapters.runner",
        "adapters.intake",
        "adapters.delivery",
        "adapters.progress_notes",
        "adapters.channel_lifecycle",
        "adapters.chat_commands",
    }
)


def _module_level_imports(path: Path) -> set[str]:
    """Modules imported when ``path`` is imported (not those under ``TYPE_CHECKING`` or inside functions)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("plugin", PLUGINS)
def test_plugins_import_the_seam_not_the_runner(plugin: str) -> None:
    imports = _module_level_imports(ROOT / "adapters" / plugin)
    assert not imports & RUNNER_PARTS, f"adapters/{plugin} imports {sorted(imports & RUNNER_PARTS)}"


def test_the_seam_imports_nothing_of_the_adapters_anywhere() -> None:
    # The runner imports the seam, never the other way: not at module level, not inside a function, not
    # for types (an import cycle between the seam and the runner's parts was counted in bench/structure.py).
    tree = ast.parse((ROOT / "adapters" / "platform.py").read_text())
    found = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    found |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {name for name in found if name.startswith("adapters")}, sorted(found)


def test_agentpost_run_finds_the_channel_runner_by_its_entry_point() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["agentpost.channel_runner"] == {
        "run": "adapters.runner:run_process"
    }


def test_channel_entry_points_name_platform_classes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    channels = project["project"]["entry-points"]["agentpost.channels"]
    assert set(channels) == {"telegram", "discord", "whatsapp", "slack"}
    for name, target in channels.items():
        module, _, cls = target.partition(":")
        tree = ast.parse((ROOT / Path(*module.split("."))).with_suffix(".py").read_text())
        bases = [
            ast.unparse(base)
            for node in tree.body
            if isinstance(node, ast.ClassDef) and node.name == cls
            for base in node.bases
        ]
        assert bases == ["Platform"], f"{name}: {target} should subclass Platform, has {bases}"


def test_the_plugin_contract_is_named_in_the_seams_docstring() -> None:
    # A plugin author reads the module docstring: every method a plugin overrides or calls, and every helper
    # function it imports, is named there (a helper moved out of the class must not drop out of sight).
    tree = ast.parse((ROOT / "adapters" / "platform.py").read_text())
    doc = ast.get_docstring(tree) or ""
    platform = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Platform")
    methods = {
        node.name
        for node in platform.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_")
    }
    helpers = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_")
    }
    missing = {f"Platform.{name}" for name in methods} | helpers
    missing = {name for name in missing if f"`{name}`" not in doc}
    assert not missing, f"adapters/platform.py's docstring does not name {sorted(missing)}"
