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

Run as a script to build the hosts by hand and look around (``up``), or to remove leftovers (``down``)::

    python -m tests.netns up      # then: ip netns exec apnet-a ping 10.231.0.1
    python -m tests.netns down
"""

from __future__ import annotations

import contextlib
import fcntl
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
def exclusive() -> Iterator[None]:
    """One user of the namespaces and the server's listen settings at a time on this machine."""
    with LOCK_FILE.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
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
            lines = self._hba.read_text().splitlines(keepends=True)
            self._hba.write_text("".join(line for line in lines if HBA_MARK not in line))
        with self._admin() as conn:
            if self._before is None:
                conn.execute("ALTER SYSTEM RESET listen_addresses")
            else:
                conn.execute(f"ALTER SYSTEM SET listen_addresses = '{self._before}'")
            conn.execute("SELECT pg_reload_conf()")


def main(argv: Sequence[str]) -> int:
    """``up``: build the two hosts and make PostgreSQL listen for them (until Ctrl-C); ``down``: remove
    leftovers of a run that was killed."""
    command = argv[0] if argv else ""
    reason = unavailable()
    if reason:
        print(f"cannot build the hosts: {reason}", file=sys.stderr)
        return 2
    if command == "down":
        TwoHosts().down()
        return 0
    if command != "up":
        print("usage: python -m tests.netns up|down", file=sys.stderr)
        return 2
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
