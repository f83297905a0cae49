"""Two "hosts" on one machine, each with a network of its own, joined to this machine's PostgreSQL over a real
(virtual) link: what tests/e2e/test_two_hosts.py runs agentpost in (issue 30).

Each host is a network namespace (``ip netns add``) joined to the machine by a veth pair with a /30 of its own
in 10.231.0.0/24: host ``i`` has ``10.231.0.{4i+2}`` inside and the machine ``10.231.0.{4i+1}`` on its end.
A namespace has no other route: whatever runs inside reaches only its own peer address, where the test
makes the PostgreSQL server listen (:class:`PgListen`) and serves the platform fakes. A process is started
in a host with :meth:`TwoHosts.command`: inside the namespace and in a UTS namespace of its own whose host
name is the host's, so agentpost's worker ids (``host:pid:start``, shared/worker_identity.py) name it.

- :meth:`TwoHosts.cut` / :meth:`TwoHosts.mend` take a host's link down and up (``ip link set … down`` on its
  side of the veth): a partition, not a death; its processes go on running.
- :class:`PgListen` makes the local cluster listen on the machine's ends of the links (``ALTER SYSTEM SET
  listen_addresses``, a ``trust`` line for the subnet in pg_hba.conf, a restart only when the server does
  not listen there yet) and puts the configuration back afterwards (the sockets already open stay until the
  server's next restart: harmless, the addresses are gone with the namespaces).
- :func:`restart_postgres` restarts the cluster (``pg_ctlcluster … restart``) and waits until it answers.

Run as a script to build the hosts by hand and look around (``up``), or to remove what a killed run left
(``down``: the namespaces and links, the pg_hba.conf line, the test's addresses in ``listen_addresses``;
see :func:`down`)::

    python -m tests.netns up      # then: ip netns exec apnet-a ping 10.231.0.1
    python -m tests.netns down
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import psycopg

SUBNET = "10.231.0.0/24"
PG_PORT = 5432
ADMIN_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
#: The comment that marks the pg_hba.conf line this module adds (and removes).
HBA_MARK = "# agentpost tests/netns.py"
LOCK_FILE = Path("/tmp/agentpost-netns.lock")


@dataclass(frozen=True)
class Host:
    """One host: its name (the host name its processes see), namespace, and the two ends of its link."""

    name: str
    netns: str
    outside: str  # the machine's end: PostgreSQL and the fakes listen here for this host
    inside: str  # the host's own address
    veth_out: str
    veth_in: str


def unavailable() -> str | None:
    """Why network namespaces cannot be built here, or None."""
    if os.geteuid() != 0:
        return "building network namespaces needs root"
    for tool in ("ip", "unshare", "hostname", "pg_ctlcluster", "pg_lsclusters"):
        if shutil.which(tool) is None:
            return f"the {tool!r} command is missing"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and result.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


@contextlib.contextmanager
def exclusive(*, wait: bool = True) -> Iterator[None]:
    """One user of the namespaces and the server's listen settings at a time on this machine. Without
    ``wait``, :class:`BlockingIOError` when another process holds them (a two-host run in progress)."""
    with LOCK_FILE.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class TwoHosts:
    """The namespaces, links and addresses of ``names`` (two by default); a context manager that removes
    them on the way out, also after a failure, and removes leftovers of an earlier run on the way in."""

    def __init__(self, names: Sequence[str] = ("hosta", "hostb"), prefix: str = "apnet") -> None:
        self.hosts = [
            Host(
                name=name,
                netns=f"{prefix}-{chr(ord('a') + i)}",
                outside=f"10.231.0.{4 * i + 1}",
                inside=f"10.231.0.{4 * i + 2}",
                veth_out=f"{prefix}{i}o",
                veth_in=f"{prefix}{i}i",
            )
            for i, name in enumerate(names)
        ]

    def __enter__(self) -> TwoHosts:
        self.down()
        try:
            for host in self.hosts:
                _ip("netns", "add", host.netns)
                _ip("link", "add", host.veth_out, "type", "veth", "peer", "name", host.veth_in)
                _ip("link", "set", host.veth_in, "netns", host.netns)
                _ip("addr", "add", f"{host.outside}/30", "dev", host.veth_out)
                _ip("link", "set", host.veth_out, "up")
                _ip("-n", host.netns, "addr", "add", f"{host.inside}/30", "dev", host.veth_in)
                _ip("-n", host.netns, "link", "set", host.veth_in, "up")
                _ip("-n", host.netns, "link", "set", "lo", "up")
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.down()

    def down(self) -> None:
        """Remove the namespaces and links (deleting a namespace deletes its end of the veth, and so both)."""
        for host in self.hosts:
            _ip("netns", "del", host.netns, check=False)
            _ip("link", "del", host.veth_out, check=False)

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def command(self, host: Host, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``: its network, and its own host name (the process is exec'd, so the
        pid a caller gets is the pid of ``argv``'s process)."""
        return [
            "ip",
            "netns",
            "exec",
            host.netns,
            "unshare",
            "--uts",
            "--",
            "sh",
            "-c",
            'hostname "$0" && exec "$@"',
            host.name,
            *argv,
        ]

    def cut(self, host: Host) -> None:
        """Take the host's link down: its packets go nowhere until :meth:`mend` (a partition)."""
        _ip("-n", host.netns, "link", "set", host.veth_in, "down")

    def mend(self, host: Host) -> None:
        """Bring the host's link back (its address and route come back with it)."""
        _ip("-n", host.netns, "link", "set", host.veth_in, "up")


def cluster() -> tuple[str, str]:
    """(version, name) of the local cluster on :data:`PG_PORT` (from ``pg_lsclusters``)."""
    out = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[2] == str(PG_PORT):
            return fields[0], fields[1]
    raise RuntimeError(f"no PostgreSQL cluster on port {PG_PORT} in pg_lsclusters:\n{out}")


def _answers(address: str, timeout: float = 1.0) -> bool:
    try:
        with psycopg.connect(f"postgresql://postgres@{address}:{PG_PORT}/postgres", connect_timeout=timeout):
            return True
    except psycopg.Error:
        return False


def wait_answering(addresses: Sequence[str], timeout: float = 60.0) -> None:
    """Until the server accepts connections on every one of ``addresses``."""
    deadline = time.monotonic() + timeout
    while not all(_answers(a) for a in addresses):
        if time.monotonic() > deadline:
            raise TimeoutError(f"PostgreSQL did not answer on {', '.join(addresses)} within {timeout:g} s")
        time.sleep(0.2)


def restart_postgres() -> float:
    """``pg_ctlcluster VERSION NAME restart`` (every session is cut; the server is away meanwhile); the
    seconds until it answered again on loopback."""
    version, name = cluster()
    began = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, name, "restart"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    wait_answering(["127.0.0.1"])
    return time.monotonic() - began


def _listening(address: str) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((address, PG_PORT)) == 0


class PgListen:
    """The local PostgreSQL server accepting connections on ``addresses`` (trust, as on loopback) for the
    duration; see the module docstring."""

    def __init__(self, addresses: Sequence[str]) -> None:
        self.addresses = list(addresses)
        self._hba: Path | None = None
        self._before: str | None = None  # listen_addresses as ALTER SYSTEM had it (None: not set there)

    def _admin(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(ADMIN_PG_URL, autocommit=True, connect_timeout=5)

    def __enter__(self) -> PgListen:
        with self._admin() as conn:
            current = str(conn.execute("SHOW listen_addresses").fetchone()[0])  # type: ignore[index]
            self._hba = Path(str(conn.execute("SHOW hba_file").fetchone()[0]))  # type: ignore[index]
            row = conn.execute(
                "SELECT setting FROM pg_file_settings WHERE name = 'listen_addresses' "
                "AND sourcefile LIKE '%postgresql.auto.conf' ORDER BY seqno DESC LIMIT 1"
            ).fetchone()
            self._before = None if row is None else str(row[0])
            wanted = [a.strip() for a in current.split(",") if a.strip()]
            wanted += [a for a in self.addresses if a not in wanted]
            text = self._hba.read_text()
            if HBA_MARK not in text:
                self._hba.write_text(text.rstrip("\n") + f"\nhost all all {SUBNET} trust {HBA_MARK}\n")
            conn.execute(f"ALTER SYSTEM SET listen_addresses = '{','.join(wanted)}'")
            conn.execute("SELECT pg_reload_conf()")
        try:
            if not all(_listening(a) for a in self.addresses):
                restart_postgres()  # listen_addresses is read only at the server's start
            wait_answering(self.addresses)
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._restore()

    def _restore(self) -> None:
        if self._hba is not None:
            remove_hba_lines(self._hba)
        with self._admin() as conn:
            if self._before is None:
                conn.execute("ALTER SYSTEM RESET listen_addresses")
            else:
                conn.execute(f"ALTER SYSTEM SET listen_addresses = '{self._before}'")
            conn.execute("SELECT pg_reload_conf()")


def remove_hba_lines(hba_file: Path) -> int:
    """Remove the lines :class:`PgListen` added to ``hba_file`` (those carrying :data:`HBA_MARK`); how many
    went. The file is rewritten in place (its owner and mode stay) and only when it held one."""
    lines = hba_file.read_text().splitlines(keepends=True)
    kept = [line for line in lines if HBA_MARK not in line]
    if len(kept) != len(lines):
        hba_file.write_text("".join(kept))
    return len(lines) - len(kept)


def _ours(address: str) -> bool:
    """Whether ``address`` (an entry of ``listen_addresses``) is one of the links' addresses."""
    try:
        return ipaddress.ip_address(address) in ipaddress.ip_network(SUBNET)
    except ValueError:
        return False  # a host name, '*', 'localhost': never one of ours


def _addresses(value: str) -> list[str]:
    return [a.strip() for a in value.split(",") if a.strip()]


def listen_restore(settings: Sequence[tuple[str, bool]]) -> str | None:
    """The ``ALTER SYSTEM`` statement that takes the links' addresses out of ``listen_addresses``, given the
    setting's lines in the configuration files in the order the server reads them (``(value, from
    postgresql.auto.conf)``, as ``pg_file_settings`` lists them); None when the ``ALTER SYSTEM`` value holds
    none of them. ``RESET`` when what stays is what the other files say (as before the run), ``SET`` to
    what stays otherwise (a value someone had set with ``ALTER SYSTEM`` before the run)."""
    auto = [value for value, is_auto in settings if is_auto]
    if not auto or not any(_ours(a) for a in _addresses(auto[-1])):
        return None
    others = [value for value, is_auto in settings if not is_auto]
    base = _addresses(others[-1]) if others else ["localhost"]  # PostgreSQL's default
    staying = [a for a in _addresses(auto[-1]) if not _ours(a)]
    if not staying or staying == base:
        return "ALTER SYSTEM RESET listen_addresses"
    return f"ALTER SYSTEM SET listen_addresses = '{','.join(staying)}'"


def reset_listen_addresses(conn: psycopg.Connection[tuple[object, ...]]) -> str | None:
    """Run :func:`listen_restore`'s statement on the server of ``conn`` (after a run killed before it put
    ``listen_addresses`` back); returns it, or None when nothing needed doing (nothing is written then).
    The caller reloads the configuration; the server goes on listening on the addresses until its next
    restart (harmless: they went with the links)."""
    rows = conn.execute(
        "SELECT setting, sourcefile LIKE '%postgresql.auto.conf' FROM pg_file_settings "
        "WHERE name = 'listen_addresses' AND error IS NULL ORDER BY seqno"
    ).fetchall()
    statement = listen_restore([(str(value), bool(is_auto)) for value, is_auto in rows])
    if statement is not None:
        conn.execute(statement)
    return statement


def restore_postgres(conn: psycopg.Connection[tuple[object, ...]], hba_file: Path | None = None) -> list[str]:
    """Put back PostgreSQL's configuration after a killed run: the :data:`HBA_MARK` lines of ``hba_file``
    (the server's own, ``SHOW hba_file``, when None) and the links' addresses in ``listen_addresses``; the
    configuration is reloaded only when one of the two changed, and the server is never restarted. Returns
    what was done, one line each."""
    if hba_file is None:
        hba_file = Path(str(conn.execute("SHOW hba_file").fetchone()[0]))  # type: ignore[index]
    done = []
    removed = remove_hba_lines(hba_file)
    if removed:
        done.append(f"removed {removed} line(s) marked {HBA_MARK!r} from {hba_file}")
    listen = reset_listen_addresses(conn)
    if listen:
        done.append(listen)
    if removed or listen:
        conn.execute("SELECT pg_reload_conf()")
        done.append("reloaded the server's configuration (no restart)")
    else:
        done.append("PostgreSQL's configuration holds nothing of a run: left as it is")
    return done


def down(hba_file: Path | None = None) -> list[str]:
    """Remove what a killed two-host run left: the namespaces and links, then :func:`restore_postgres`.
    Returns what was done, one line each."""
    TwoHosts().down()
    with psycopg.connect(ADMIN_PG_URL, autocommit=True, connect_timeout=5) as conn:
        return ["removed the namespaces and links (if any)", *restore_postgres(conn, hba_file)]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.netns",
        description="The two network-namespace hosts of tests/e2e/test_two_hosts.py.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser(
        "up",
        help="build the two hosts and make PostgreSQL listen for them (restarting it when it does not "
        "listen there yet), until Ctrl-C; everything is put back on the way out",
    )
    down_cmd = commands.add_parser(
        "down",
        help="remove what a killed run left: the namespaces and links, the pg_hba.conf line it added and its "
        "addresses in listen_addresses (ALTER SYSTEM); reloads PostgreSQL's configuration only when one of "
        "those changed, never restarts it (the server listens on the gone addresses until its next restart, "
        "which is harmless); refuses while a two-host run holds the lock",
        description="Remove what a killed two-host run left; never restarts PostgreSQL.",
    )
    down_cmd.add_argument(
        "--hba-file",
        type=Path,
        default=None,
        help="the pg_hba.conf to clean (default: the server's, SHOW hba_file)",
    )
    return parser


def main(argv: Sequence[str]) -> int:
    """``up``: build the two hosts and make PostgreSQL listen for them (until Ctrl-C); ``down``: remove
    leftovers of a run that was killed (:func:`down`)."""
    args = _parser().parse_args(list(argv))
    reason = unavailable()
    if reason:
        print(f"cannot build the hosts: {reason}", file=sys.stderr)
        return 2
    if args.command == "down":
        try:
            with exclusive(wait=False):
                for line in down(args.hba_file):
                    print(line)
        except BlockingIOError:
            print(f"a two-host run holds {LOCK_FILE}: nothing done", file=sys.stderr)
            return 1
        return 0
    with exclusive(), TwoHosts() as net, PgListen([h.outside for h in net.hosts]):
        for host in net.hosts:
            print(
                f"{host.name}: ip netns exec {host.netns} …  ({host.inside} → PostgreSQL at {host.outside})"
            )
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
