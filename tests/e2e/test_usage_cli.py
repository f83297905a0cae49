"""``agentpost usage`` as an operator runs it: a table by default, plain-words refusals of bad options."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from shared.clock import now_ms
from shared.usage import UsageRecord, record_usage_in
from tests.homes import open_home
from tests.web_support import make_home

pytestmark = pytest.mark.e2e

AGENTPOST = str(Path(sys.executable).with_name("agentpost"))


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTPOST_")}
    env.update(AGENTPOST_HOME=str(home), COLUMNS="200", NO_COLOR="1")
    return subprocess.run([AGENTPOST, "usage", *args], env=env, capture_output=True, text=True, timeout=60)


def test_usage_prints_a_table_and_refuses_bad_options_in_plain_words(tmp_path: Path) -> None:
    home = make_home(tmp_path)
    empty = run(home)
    assert empty.returncode == 0, empty.stderr
    assert "no runs with recorded usage in the last 7d" in empty.stdout
    rt = open_home(home)
    try:
        with rt.db.transaction() as tx:
            for day in (0, 1):
                at = now_ms() - day * 86_400_000
                record = UsageRecord(agent="alpha", sender="telegram:42", input_tokens=100, cost_usd=0.5)
                record_usage_in(tx, record, at=at)
    finally:
        rt.close()
    table = run(home, "--by", "sender")
    assert table.returncode == 0, table.stderr
    (row,) = [line for line in table.stdout.splitlines() if "telegram:42" in line]
    assert row.split()[1:3] == ["2", "200"] and row.split()[-1] == "1.0000", row
    by_day = run(home, "--by", "day", "--since", "2d")
    assert by_day.stdout.count(" 0.5000") == 2, by_day.stdout
    for args, words in ((["--by", "planet"], "cannot group by 'planet'"), (["--since", "soon"], "7d")):
        refused = run(home, *args)
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
