"""Runtime.refresh_settings: an edited settings.toml takes effect in routing, the queue's tuning and the
processor; a broken one keeps what is in force, says why once, and is taken up again once fixed."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest

from shared.chat.address import ChatAddress
from shared.runtime import SETTINGS_CHECK_INTERVAL_S
from tests.processor_support import agent_script, command_agent, make_home, open_home, run_idle, wait_for
from workers.processor import Processor

pytestmark = pytest.mark.integration


def _touch_later(path: Path, text: str) -> None:
    """Write ``text`` so that the file's signature surely changes (mtime granularity aside)."""
    path.write_text(text, encoding="utf-8")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_an_edit_reaches_routing_queue_tuning_and_the_processor(tmp_path: Path) -> None:
    script = agent_script(tmp_path)
    home = make_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"solo": command_agent(script)})
    with open_home(home) as rt:
        processor = Processor(rt)
        assert processor.agents == ["solo"]
        assert not rt.refresh_settings()  # nothing changed
        settings_file = home / "settings.toml"
        text = settings_file.read_text().replace("max_retries = 3", "max_retries = 7")
        text += f'\n[agents.coder]\nprovider = "command"\ncommand = {[*command_agent(script)["command"]]!r}\n'
        _touch_later(settings_file, text.replace("'", '"'))
        assert rt.refresh_settings()
        assert "coder" in rt.queue.directory.agents
        assert rt.queue.config.max_retries == 7
        assert processor.agents == ["coder", "solo"]
        assert processor.settings is rt.settings
        queued = rt.queue.intake.enqueue_message(ChatAddress("api", "tester"), "@coder hi there")
        assert queued.agent == "coder"
        run_idle(rt)
        msg = rt.queue.admin.get_message(queued.message_id)
        assert msg is not None and msg.status == "completed"


def test_the_settings_property_looks_at_the_file_about_once_a_second(tmp_path: Path) -> None:
    script = agent_script(tmp_path)
    home = make_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"solo": command_agent(script)})
    with open_home(home) as rt:
        before = rt.settings
        _touch_later(home / "settings.toml", (home / "settings.toml").read_text() + "\n[teams]\n")
        assert rt.settings is before  # looked at moments ago: not yet
        wait_for(lambda: rt.settings is not before, SETTINGS_CHECK_INTERVAL_S + 2, "the reload")


def test_a_broken_file_keeps_the_settings_in_force_and_is_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = agent_script(tmp_path)
    home = make_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"solo": command_agent(script)})
    settings_file = home / "settings.toml"
    good = settings_file.read_text()
    with open_home(home) as rt, caplog.at_level(logging.INFO, logger="agentpost.settings"):
        before = rt.settings
        _touch_later(settings_file, good + "\n[queue]\nmax_retries = 'many'\n")
        assert not rt.refresh_settings()
        assert not rt.refresh_settings(force=False)
        assert rt.settings is before
        assert "settings.toml" in rt.settings_error
        warnings = [r for r in caplog.records if "not reloaded" in r.getMessage()]
        assert len(warnings) == 1
        assert "\n" not in warnings[0].getMessage()  # one line in the log
        # Still routes with what is in force.
        assert rt.queue.intake.enqueue_message(ChatAddress("api", "tester"), "hello").agent == "solo"

        time.sleep(0.01)
        _touch_later(settings_file, good.replace("max_retries = 3", "max_retries = 4"))
        assert rt.refresh_settings()
        assert rt.settings_error == ""
        assert rt.queue.config.max_retries == 4


def test_the_watch_thread_updates_routing_without_anyone_reading_settings(tmp_path: Path) -> None:
    script = agent_script(tmp_path)
    home = make_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"solo": command_agent(script)})
    with open_home(home) as rt:
        assert rt.waker is not None  # a long-running process: the watch starts with the waker
        text = (home / "settings.toml").read_text()
        _touch_later(home / "settings.toml", text + '\n[agents.late]\nprovider = "claude"\n')
        wait_for(lambda: "late" in rt.queue.directory.agents, SETTINGS_CHECK_INTERVAL_S + 3, "the watch")


def test_the_scheduler_takes_up_edited_heartbeats_in_its_running_apscheduler(tmp_path: Path) -> None:
    from scheduler.service import SchedulerService

    script = agent_script(tmp_path)
    home = make_home(tmp_path, f"sqlite:///{tmp_path / 'a.db'}", {"solo": command_agent(script)})
    settings_file = home / "settings.toml"
    good = settings_file.read_text()
    with open_home(home) as rt:
        service = SchedulerService(rt)
        assert service.timed == []
        sched = service.build()  # not started: jobs are added and removed all the same
        assert not service.follow_settings(sched)

        _touch_later(settings_file, good + "\n[heartbeats.solo]\ninterval = 3600\n")
        rt.refresh_settings()
        assert service.follow_settings(sched)
        assert [j.name for j in service.timed] == ["heartbeat:solo"]
        assert sched.get_job("heartbeat:solo") is not None

        time.sleep(0.01)
        _touch_later(settings_file, good + "\n[heartbeats.nobody]\ninterval = 3600\n")  # unknown agent
        rt.refresh_settings()
        assert not service.follow_settings(sched)
        assert [j.name for j in service.timed] == ["heartbeat:solo"]  # kept
        assert sched.get_job("heartbeat:solo") is not None

        time.sleep(0.01)
        _touch_later(settings_file, good)
        rt.refresh_settings()
        assert service.follow_settings(sched)
        assert service.timed == [] and sched.get_job("heartbeat:solo") is None
