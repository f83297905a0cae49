"""The way out of a sandboxed run's network: a TCP port on the sandbox's own loopback that leads to the
egress proxy's Unix socket.

Usage (inside the sandbox, as the agent's user): ``python -I -S netforward.py SOCKET PORT -- ARGV...``.

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


def main(argv: list[str]) -> int:
    if len(argv) < 5 or argv[3] != "--":
        sys.stderr.write("usage: netforward.py SOCKET PORT -- ARGV...\n")
        return 2
    path, port, command = argv[1], int(argv[2]), argv[4:]
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
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"cannot run {command[0]}: {exc.strerror or exc}\n")
        return 127
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv))
