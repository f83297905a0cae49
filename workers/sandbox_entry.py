"""What a sandboxed run does first, inside the sandbox as the agent's user, before it becomes the CLI.

Usage: ``python -I -S sandbox_entry.py [--egress SOCKET PORT] -- ARGV...``.

1. **A session keyring of its own.** The kernel keeps keys per session and per user, and a child inherits
   its parent's session keyring: without this the run would share the processor's (and every other run's).
   It joins a new, empty anonymous one (``keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)``).
2. **The way out of its network** (``--egress``): a TCP port on the sandbox's own loopback that leads to the
   egress proxy's Unix socket.

A run has a network namespace of its own with nothing in it but loopback, so ``HTTPS_PROXY`` must name a TCP
address there; the proxy itself runs outside (:mod:`workers.egress`), reachable only through ``SOCKET``, a
Unix socket bound into the sandbox. This program listens on ``127.0.0.1:PORT`` first (so the CLI's first
request finds it), then forks: the child carries each connection to the socket, byte for byte; the parent
becomes the CLI (``exec``), keeping its pid, its stdin and stdout and its exit status. The child dies with
the CLI (``PR_SET_PDEATHSIG``), and in any case with the sandbox's PID namespace.

It decides nothing: every connection is judged by the proxy. Only the standard library, started with
``-S`` (a few ms).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import threading

PR_SET_PDEATHSIG = 1
KEYCTL_JOIN_SESSION_KEYRING = 1
#: The keyctl system call's number (the C library has no wrapper; libkeyutils is not always installed).
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "i686": 288, "armv7l": 311, "ppc64le": 280, "s390x": 280}
_CHUNK = 65536


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends, then pass the end on (a half close)."""
    try:
        while True:
            data = source.recv(_CHUNK)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        try:  # noqa: SIM105 - contextlib is one more import on the start-up path
            sink.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _carry(client: socket.socket, path: str) -> None:
    try:
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        upstream.connect(path)
    except OSError:
        client.close()
        return
    back = threading.Thread(target=_pipe, args=(upstream, client), daemon=True)
    back.start()
    _pipe(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            continue
        threading.Thread(target=_carry, args=(client, path), daemon=True).start()


def _detach_from_cli_streams() -> None:
    """The forwarder must not hold the CLI's stdin, stdout or stderr: the processor reads them to their
    end, which must come when the CLI exits."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def join_new_session_keyring() -> bool:
    """Leave the inherited session keyring for a new, empty one; False where the kernel says no."""
    number = _SYS_KEYCTL.get(os.uname().machine)
    if number is None:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None)) >= 0
    except (OSError, AttributeError):
        return False


def _start_forwarder(path: str, port: int) -> None:
    """Listen on the sandbox's loopback, then fork the child that carries connections to ``path``."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    cli = os.getpid()
    if os.fork() == 0:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        if os.getppid() != cli:
            os._exit(0)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        _detach_from_cli_streams()
        _serve(listener, path)
        os._exit(0)
    listener.close()


def main(argv: list[str]) -> int:
    args = argv[1:]
    egress: tuple[str, int] | None = None
    if args[:1] == ["--egress"] and len(args) >= 3:
        egress = (args[1], int(args[2]))
        args = args[3:]
    if len(args) < 2 or args[0] != "--":
        sys.stderr.write("usage: sandbox_entry.py [--egress SOCKET PORT] -- ARGV...\n")
        return 2
    command = args[1:]
    join_new_session_keyring()
    if egress is not None:
        _start_forwarder(*egress)
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"cannot run {command[0]}: {exc.strerror or exc}\n")
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv))
