"""Workspaces across hosts (issue 30): a processor that takes over an agent whose workspace another host made
does not run it in an empty folder.

Two "hosts" share one database: each is a home of its own (its own ``workspace_dir``) and a processor whose
worker id names its host. Host A runs the agent first (the workspace is made there, with its marker, and
recorded). Host B, without the folder, refuses the next message: it ends dead with one plain notice to the
chat, its error names both hosts and the path (what ``agentpost trace`` shows), the agent never ran, and
``doctor``'s agent checks on host B say so. A copy of A's folder (marker included), or
``workspace_shared = true``, lets B run it. The scripted CLI logs every run it makes, so "never ran" is
what really happened, not the processor's bookkeeping.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from shared.chat.address import ChatAddress
from shared.queue.workspaces import workspace_record
from shared.runtime import Runtime
from shared.settings.model import load_settings
from tests.homes import build_home, update_settings
from tests.processor_support import agent_script, command_agent, open_home, read_invocations, run_idle
from workers import doctor
from workers.processor_config import ProcessorSettings
from workers.workspace import MARKER

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _host(tmp: Path, name: str, db_url: str, script: Path, **agent: Any) -> Path:
    return build_home(
        tmp,
        db_url,
        {"coder": command_agent(script, **agent)},
        folder=f"home-{name}",
        extra={"workspace_dir": str(tmp / f"ws-{name}")},
    )


def _serve(rt: Runtime, host: str, log: Path) -> None:
    """One processor of ``host`` until the queue is idle."""
    config = ProcessorSettings(worker_id=f"{host}:1:1", recover_interval_seconds=0.5, sandbox="none")
    run_idle(rt, env={"PATH": os.environ.get("PATH", ""), "AGENT_LOG": str(log)}, config=config)


def _send(rt: Runtime, text: str) -> str:
    return rt.queue.intake.enqueue_message(
        ChatAddress("api", "ann", conversation="c1"), text, agent="coder"
    ).message_id


def _row(rt: Runtime, message_id: str) -> dict[str, Any]:
    (row,) = rt.db.read("SELECT status, last_error FROM messages WHERE message_id = :m", {"m": message_id})
    return dict(row)


def _replies(rt: Runtime, message_id: str) -> list[str]:
    rows = rt.db.read("SELECT message FROM responses WHERE message_id = :m ORDER BY id", {"m": message_id})
    return [str(r["message"]) for r in rows]


def test_a_host_without_the_workspace_refuses_plainly_until_it_has_it(
    tmp_path: Path, sqlite_url: str
) -> None:
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    home_a = _host(tmp_path, "a", sqlite_url, script)
    home_b = _host(tmp_path, "b", sqlite_url, script)
    with open_home(home_a) as rt_a, open_home(home_b) as rt_b:
        first = _send(rt_a, "build the thing")
        _serve(rt_a, "hosta", log)
        assert _row(rt_a, first)["status"] == "completed"
        marker = json.loads((tmp_path / "ws-a" / "coder" / MARKER).read_text())
        record = workspace_record(rt_a.db, "coder")
        assert record is not None and record["id"] == marker["id"] and record["host"] == "hosta"
        (tmp_path / "ws-a" / "coder" / "work.txt").write_text("what the agent built")

        # Host B takes the agent over without its workspace: refused, explained, not run.
        second = _send(rt_b, "carry on")
        _serve(rt_b, "hostb", log)
        row = _row(rt_b, second)
        assert row["status"] == "dead"
        assert "hosta" in row["last_error"] and "hostb" in row["last_error"]
        assert str(tmp_path / "ws-b" / "coder") in row["last_error"]
        (notice,) = _replies(rt_b, second)
        assert "another server (hosta)" in notice and "Traceback" not in notice and MARKER not in notice
        assert len(read_invocations(log)) == 1  # only host A's run
        assert not (tmp_path / "ws-b" / "coder").exists()  # nothing was made in its place
        found = [c for c in doctor.checks(load_settings(home_b, env={})) if c.name == "agent coder workspace"]
        assert [c.level for c in found] == ["warn"] and "hosta" in found[0].detail
        # Host A itself is fine.
        assert not [c for c in doctor.checks(load_settings(home_a, env={})) if "workspace" in c.name]

        # An empty folder of the same name (a mount that is not mounted) is not the workspace either.
        (tmp_path / "ws-b" / "coder").mkdir(parents=True)
        third = _send(rt_b, "and again")
        _serve(rt_b, "hostb", log)
        assert _row(rt_b, third)["status"] == "dead" and len(read_invocations(log)) == 1

        # A copy of A's folder, marker included, is the workspace: B runs the agent in it.
        shutil.rmtree(tmp_path / "ws-b" / "coder")
        shutil.copytree(tmp_path / "ws-a" / "coder", tmp_path / "ws-b" / "coder")
        fourth = _send(rt_b, "now with the files")
        _serve(rt_b, "hostb", log)
        assert _row(rt_b, fourth)["status"] == "completed" and len(read_invocations(log)) == 2
        assert workspace_record(rt_b.db, "coder") == record  # still the workspace host A made


def test_a_shared_workspace_runs_on_any_host(tmp_path: Path, sqlite_url: str) -> None:
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    home_a = _host(tmp_path, "a", sqlite_url, script)
    home_b = _host(tmp_path, "b", sqlite_url, script)
    with open_home(home_a) as rt_a:
        _send(rt_a, "start")
        _serve(rt_a, "hosta", log)
    update_settings(home_b, "agents", {"coder": command_agent(script, workspace_shared=True)})
    with open_home(home_b) as rt_b:
        second = _send(rt_b, "carry on")
        _serve(rt_b, "hostb", log)
        assert _row(rt_b, second)["status"] == "completed"
    assert len(read_invocations(log)) == 2
    assert (tmp_path / "ws-b" / "coder" / MARKER).exists()


def test_a_workspace_removed_on_its_own_host_is_made_again(tmp_path: Path, sqlite_url: str) -> None:
    """On the host that made it, a missing workspace is made afresh, as on a single machine."""
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    home = _host(tmp_path, "a", sqlite_url, script)
    with open_home(home) as rt:
        _send(rt, "one")
        _serve(rt, "hosta", log)
        before = workspace_record(rt.db, "coder")
        shutil.rmtree(tmp_path / "ws-a" / "coder")
        again = _send(rt, "two")
        _serve(rt, "hosta", log)
        assert _row(rt, again)["status"] == "completed"
        after = workspace_record(rt.db, "coder")
    assert before is not None and after is not None and after["id"] != before["id"]
    assert len(read_invocations(log)) == 2


def test_pinned_agents_run_only_on_their_hosts(tmp_path: Path, sqlite_url: str) -> None:
    """``[processor] agents`` pins agents to hosts: each processor leaves the other's agent waiting."""
    script, log = agent_script(tmp_path), tmp_path / "runs.log"
    agents = {"coder": command_agent(script), "writer": command_agent(script)}
    home = build_home(tmp_path, sqlite_url, agents)
    with open_home(home) as rt:
        ids = {
            agent: rt.queue.intake.enqueue_message(
                ChatAddress("api", "ann", conversation=agent), "hi", agent=agent
            ).message_id
            for agent in agents
        }
        env = {"PATH": os.environ.get("PATH", ""), "AGENT_LOG": str(log)}
        for host, agent in (("hosta", "coder"), ("hostb", "writer")):
            config = ProcessorSettings(worker_id=f"{host}:1:1", agents=[agent], sandbox="none")
            run_idle(rt, env=env, config=config)
            assert _row(rt, ids[agent])["status"] == "completed"
            other = "writer" if agent == "coder" else "coder"
            assert _row(rt, ids[other])["status"] == ("pending" if agent == "coder" else "completed")
    assert sorted(r.agent for r in read_invocations(log)) == ["coder", "writer"]
