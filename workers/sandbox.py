"""The sandbox every agent CLI runs in: its own workspace writable, the chat's uploads readable, and nothing of
agentpost's home, database, settings, other workspaces or other processes.

An agent reads untrusted chat text and may run commands; with the service's own rights one run could read the
database (every conversation), ``settings.toml``, every other agent's workspace, and — through
``/proc/<pid>/environ`` — the channel tokens of every agentpost process. The sandbox takes those away:

- **namespaces** (bubblewrap, ``bwrap``): a private mount namespace that shows the system read-only and hides
  agentpost's home, the service user's home folder, ``/tmp`` and ``/run`` (empty in their place), then
  shows back only the agent's workspace (writable), its own CLI home (writable: the CLI's sessions and login
  live there), the chat's upload folder (read-only) and the tools the run needs (read-only); a private PID
  namespace with its own ``/proc``, so no other process — and no other process's environment — is visible;
  its own IPC and host-name namespaces; and its own network namespace, loopback only, whose one way out is
  the egress proxy (:mod:`workers.egress`: the agent's AI service and the hosts named for it) through a Unix
  socket bound in and the forwarder of :mod:`workers.sandbox_entry`.
- **as a dedicated user**, when the service runs as root: the CLI runs as ``agentpost-agent`` (one user for
  every agent: the mount namespace already keeps agents out of each other's workspaces and PID namespaces
  keep their processes apart, so a user per agent would add passwd entries, not isolation). Anything the
  namespaces let through — a file under ``/etc`` readable only by root, a root-owned socket — stays closed
  to it by ordinary permissions, and an escape from the namespaces lands in an unprivileged account.
- **none**, where neither can be had (no ``bwrap``, user namespaces turned off): the CLI runs with the
  service's rights. ``agentpost doctor`` says so, and fails for agents that bypass permission prompts.

The processor chooses once, at start (:func:`choose`, kept by :class:`SandboxChoice`), from ``[processor]
sandbox``: ``auto`` (namespaces when they work, else none, said loudly), ``namespaces`` (refuse to start
without them) or ``none``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import pwd
import shutil
import stat
import string
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePath
from typing import Literal

from shared import safe_files
from shared.chat.sessions import AGENT_SCOPE_KEY
from workers.egress import SANDBOX_PROXY_PORT, SANDBOX_SOCKET

log = logging.getLogger("agentpost.processor")

_ENTRY = Path(__file__).with_name("sandbox_entry.py")
#: Every variable a CLI may take a proxy (or an exception to it) from.
_PROXY_VARIABLES = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY",
                    "https_proxy", "http_proxy", "all_proxy", "no_proxy")  # fmt: skip

#: The account agent CLIs run as when the processor runs as root (created on demand; see deploy/sysusers.d).
SANDBOX_USER = "agentpost-agent"
SandboxMode = Literal["auto", "namespaces", "none"]
SandboxKind = Literal["namespaces", "none"]


class SandboxError(Exception):
    """The sandbox the settings ask for cannot be had here; the message says why and what to do."""


@dataclass(frozen=True)
class SandboxPlan:
    """How this processor runs agent CLIs, chosen once at start."""

    kind: SandboxKind
    bwrap: str | None = None
    #: (uid, gid) the CLI runs as, when the processor runs as root; None to keep the processor's own.
    user: tuple[int, int] | None = None
    #: Why this kind, in words an operator reads (``agentpost doctor``, the processor's start-up log).
    reason: str = ""
    #: Each run gets a network namespace of its own, its only way out the egress proxy (workers/egress.py).
    network: bool = False

    @property
    def describe(self) -> str:
        if self.kind == "none":
            return f"none — agents run with agentpost's own rights ({self.reason})"
        who = f" as a user of its own per agent (ap-<agent>, group {SANDBOX_USER})" if self.user else ""
        net = (
            "; network: its own, out only through the egress proxy"
            if self.network
            else f"; network: the host's ({self.reason})"
        )
        return f"namespaces (bubblewrap){who}{net}"


@dataclass(frozen=True)
class SandboxView:
    """What one run may see besides the read-only system."""

    workspace: Path  # writable; the CLI's working directory
    cli_home: Path  # writable; the CLI's HOME (its sessions, settings and login copy)
    readable: tuple[Path, ...] = ()  # the chat's upload folder(s), read-only
    hidden: tuple[Path, ...] = ()  # agentpost's home, the database's folder, the service user's home
    tools: tuple[
        Path, ...
    ] = ()  # shown back read-only inside a hidden folder: the CLI's install, the interpreter
    env: Mapping[str, str] = field(default_factory=dict)
    #: The egress proxy's Unix socket for this agent (bound in at SANDBOX_SOCKET); None: no way out.
    egress: Path | None = None
    #: agentpost's home: folders under it may be handed to the sandbox user (workspaces elsewhere only when
    #: agentpost made them).
    home: Path | None = None


def cli_home_for(home: Path, agent: str, session_key: str) -> Path:
    """The CLI's own HOME for one run: one per chat when each chat has its own conversation (the claude CLI
    keeps every conversation's transcript, its settings and hooks there, so one chat's run must never see
    or plant what another's loads), one per agent for ``session_scope = "agent"``. ``_chats`` cannot be an
    agent's name (names start with a letter or digit)."""
    if session_key == AGENT_SCOPE_KEY:
        return home / "sandbox" / agent
    digest = hashlib.sha256(session_key.encode("utf-8")).hexdigest()[:24]
    return home / "sandbox" / "_chats" / agent / digest


def runs_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def _sandbox_user(create: bool) -> tuple[int, int] | None:
    try:
        entry = pwd.getpwnam(SANDBOX_USER)
    except KeyError:
        if not create:
            return None
        _add_user(SANDBOX_USER, ["--user-group"], f"the user {SANDBOX_USER} that agents run as")
        entry = pwd.getpwnam(SANDBOX_USER)
    return entry.pw_uid, entry.pw_gid


def _add_user(name: str, options: list[str], what: str, wait: float = 10.0) -> None:
    """Create the system account ``name`` (no home, no login). Another process creating an account at the
    same moment (a second processor starting, the operator's own useradd) holds the account files' lock for
    a moment: tried again for up to ``wait`` seconds rather than failing the run. An account made meanwhile
    is fine."""
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    argv = [useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
            "/usr/sbin/nologin", *options, name]  # fmt: skip
    deadline = time.monotonic() + wait
    while True:
        made = subprocess.run(argv, capture_output=True, text=True, check=False)
        if made.returncode == 0 or "already exists" in made.stderr:
            return
        if "cannot lock" not in made.stderr or time.monotonic() > deadline:
            said = made.stderr.strip().splitlines() or [f"useradd exited with {made.returncode}"]
            raise SandboxError(f"cannot create {what}: {said[-1]}") from None
        time.sleep(0.1)


def agent_user_name(agent: str) -> str:
    """The account one agent's runs have (a root service): ``ap-<agent>``, shortened with a digest where
    that would pass the 32 characters an account name may have."""
    name = f"ap-{agent}"
    if len(name) > 32:
        name = f"ap-{agent[:20]}-{hashlib.sha256(agent.encode()).hexdigest()[:8]}"
    return name


@functools.cache
def agent_user(agent: str) -> tuple[int, int]:
    """(uid, gid) of ``agent``'s own account, created on first use: its own uid, so what the kernel keeps
    per user (the user keyring, process limits, ``/proc`` ownership) is never shared with another agent;
    the group of :data:`SANDBOX_USER`, which the chat's upload folders are shared with. Raises
    :class:`SandboxError` when it cannot be created."""
    shared = _sandbox_user(create=True)
    assert shared is not None
    name = agent_user_name(agent)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        _add_user(name, ["--gid", str(shared[1])], f"the user {name} that agent {agent} runs as")
        entry = pwd.getpwnam(name)
    return entry.pw_uid, shared[1]


def for_agent(plan: SandboxPlan, agent: str) -> SandboxPlan:
    """``plan`` for one agent's runs: a root service runs each agent as its own user (:func:`agent_user`)."""
    if plan.kind == "none" or plan.user is None:
        return plan
    return dataclasses.replace(plan, user=agent_user(agent))


def _probe(bwrap: str, user: tuple[int, int] | None, *, network: bool) -> str:
    """Run ``true`` in the sandbox as an agent would be run; '' when it works, else bwrap's complaint."""
    view = SandboxView(workspace=Path("/"), cli_home=Path("/"))
    argv = bwrap_argv(SandboxPlan("namespaces", bwrap=bwrap, user=user, network=network), view, ["true"])
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    return "" if done.returncode == 0 else (done.stderr.strip() or f"exit status {done.returncode}")


def choose(mode: SandboxMode, *, create_user: bool = True) -> SandboxPlan:
    """The sandbox this processor uses (see the module docstring). Raises :class:`SandboxError` when
    ``mode`` is ``namespaces`` and they cannot be had."""
    if mode == "none":
        return SandboxPlan("none", reason='[processor] sandbox = "none"')
    bwrap = shutil.which("bwrap")
    problem = ""
    user: tuple[int, int] | None = None
    if bwrap is None:
        problem = "bubblewrap is not installed (Debian: apt-get install bubblewrap)"
    else:
        try:
            user = _sandbox_user(create_user) if runs_as_root() else None
        except SandboxError as exc:
            problem = str(exc)
        if runs_as_root() and user is None and not problem:
            problem = f"the user {SANDBOX_USER} does not exist (agentpost init creates it)"
        if not problem:
            complaint = _probe(bwrap, user, network=True)
            if not complaint:
                return SandboxPlan("namespaces", bwrap=bwrap, user=user, network=True)
            # Some containers refuse a network namespace while allowing the rest: confine the files and
            # processes anyway, and say that the network is not (doctor fails agents that run commands).
            without = _probe(bwrap, user, network=False)
            if not without:
                why = f"no network namespace here: {complaint.splitlines()[-1]}"
                return SandboxPlan("namespaces", bwrap=bwrap, user=user, network=False, reason=why)
            problem = f"bubblewrap cannot make a sandbox here: {without.splitlines()[-1]}"
    if mode == "namespaces":
        raise SandboxError(f'[processor] sandbox = "namespaces", but {problem}')
    return SandboxPlan("none", reason=problem)


def _existing(paths: Iterable[Path]) -> list[Path]:
    seen: list[Path] = []
    for path in paths:
        if path.exists() and path not in seen:
            seen.append(path)
    return seen


def bwrap_argv(plan: SandboxPlan, view: SandboxView, argv: Sequence[str]) -> list[str]:
    """The command line that runs ``argv`` with ``view`` (see the module docstring). Later mounts go on top
    of earlier ones, so hidden folders are emptied first and the shown parts bound back after.

    As root, bubblewrap builds the view with root's rights (so it can reach a workspace inside a home
    folder only root may enter) and ``setpriv`` then drops to the sandbox user, with no capabilities and no
    way to gain privileges, before the CLI starts. Otherwise bubblewrap runs in a user namespace of the
    service user's own."""
    assert plan.bwrap is not None
    # The sandbox's entry (workers/sandbox_entry.py) runs first, on this interpreter: both are shown.
    view = dataclasses.replace(view, tools=(*view.tools, *tool_paths([sys.executable, str(_ENTRY)], {})))
    out = [plan.bwrap, "--die-with-parent"]
    if plan.user is None:
        out.append("--unshare-user")
    if plan.network:
        out.append("--unshare-net")
    out += [
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--hostname", "agent",
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--perms", "1777", "--tmpfs", "/tmp",
        "--perms", "1777", "--tmpfs", "/var/tmp",
        "--perms", "0755", "--tmpfs", "/run",
    ]  # fmt: skip
    emptied = [Path("/tmp"), Path("/var/tmp"), Path("/run")]
    for path in _existing(view.hidden):
        if path.is_dir():
            out += ["--perms", "0755", "--tmpfs", str(path)]
            emptied.append(path)
        else:
            out += ["--ro-bind", "/dev/null", str(path)]
    made: set[Path] = set()

    def inside_emptied(path: Path) -> bool:
        return any(e == path or e in path.parents for e in emptied)

    if plan.user is not None:
        # A folder on the way to what is shown that the sandbox user may not pass through (root's own home is
        # 0700: an agentpost home under it, with HOME pointing elsewhere) is emptied as well, so what is shown
        # is bound back under folders it may walk; otherwise the CLI could not reach its own home and
        # workspace by their full paths (every resumed conversation failed).
        for shown in _existing([view.cli_home, view.workspace, *view.readable, *view.tools]):
            for parent in reversed(shown.parents):
                if not inside_emptied(parent) and parent.is_dir() and not parent.stat().st_mode & 0o001:
                    out += ["--perms", "0755", "--tmpfs", str(parent)]
                    emptied.append(parent)
                    break

    def show(path: Path, how: str) -> None:
        # bubblewrap makes missing mount points 0700 (root's, as root): the sandbox user could not walk to
        # its own workspace by its full path. Each folder between an emptied one and the mount is made
        # 0755 first (it is empty: only the way to what is shown).
        for parent in reversed(path.parents):
            if parent not in made and any(e in parent.parents for e in emptied):
                out.extend(["--perms", "0755", "--dir", str(parent)])
                made.add(parent)
        if how == "--symlink":
            out.extend([how, os.readlink(path), str(path)])
        else:
            out.extend([how, str(path), str(path)])

    for path in _existing(view.tools):
        # Tools outside the emptied folders are already seen through the read-only root; a symlink is
        # recreated as a symlink (a mount cannot be placed on one), its target shown on its own.
        if inside_emptied(path):
            show(path, "--symlink" if path.is_symlink() else "--ro-bind")
    for path in _existing(view.readable):
        show(path, "--ro-bind")
    for path in (view.cli_home, view.workspace):
        show(path, "--bind")
    if view.egress is not None:
        out += ["--perms", "0755", "--dir", str(SANDBOX_SOCKET.parent),
                "--ro-bind", str(view.egress), str(SANDBOX_SOCKET)]  # fmt: skip
    for name, value in view.env.items():
        out += ["--setenv", name, value]
    out += ["--chdir", str(view.workspace), "--"]
    if plan.user is not None:
        uid, gid = plan.user
        setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
        out += [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs",
                "--inh-caps=-all", "--bounding-set=-all", "--"]  # fmt: skip
    return [*out, *entered(view, argv)]


def entered(view: SandboxView, argv: Sequence[str]) -> list[str]:
    """``argv`` started through the sandbox's entry (workers/sandbox_entry.py): a session keyring of its own,
    and the forwarder that turns the egress socket into the proxy port inside, when there is one."""
    egress = ["--egress", str(SANDBOX_SOCKET), str(SANDBOX_PROXY_PORT)] if view.egress is not None else []
    return [sys.executable, "-I", "-S", str(_ENTRY), *egress, "--", *argv]


def configured_parts(argv: Sequence[str], template: Sequence[str] | None) -> list[str]:
    """The parts of ``argv`` that come from the settings, not from a message: the program (``argv[0]``, found
    by the provider from the agent's ``command``, its variable or ``PATH``) unless the template's first part
    is filled in from a placeholder, and every part of ``template`` (the agent's ``command``) that has no
    placeholder. A part filled in from ``{prompt}`` is chat text: a path named there must not be shown in the
    sandbox (a chat user would read another agent's workspace through it)."""
    template = list(template or ())
    parts: list[str] = []
    if argv and not (template and _has_placeholder(template[0])):
        parts.append(argv[0])
    for part in template[1:]:
        if not _has_placeholder(part):
            parts.append(part.format_map({}))  # "{{" and "}}" become single braces, as in the argv
    return parts


def _has_placeholder(part: str) -> bool:
    try:
        return any(name is not None for _, name, _, _ in string.Formatter().parse(part))
    except ValueError:
        return True  # a broken template: the provider refuses it anyway


def tool_paths(
    argv: Sequence[str], env: Mapping[str, str], agents_own: Sequence[Path] = ()
) -> tuple[Path, ...]:
    """What a run needs to see of folders the sandbox hides: the files ``argv`` names (a command agent's
    script), the real location of the program (a CLI installed in a project folder or a home), and the
    interpreter prefixes of this Python (a ``python`` command agent). ``argv`` holds only parts from the
    settings (:func:`configured_parts`), never chat text. A path inside ``agents_own`` (the run's workspace
    and CLI home) is skipped: the run sees those folders anyway, and the agent may have made the path a
    link to another agent's folder, which resolving it would show."""
    found: list[Path] = []
    for arg in argv:
        if os.sep not in arg:
            located = shutil.which(arg, path=env.get("PATH"))
            if located is None:
                continue
            arg = located
        path = Path(arg)
        written = Path(os.path.normpath(path))
        if any(written == own or own in written.parents for own in agents_own):
            continue
        if path.is_absolute() and path.exists():
            found.append(path)
            real = path.resolve()
            found.append(real)
            # node packages: the program is a script inside its package; show the whole node_modules.
            for parent in real.parents:
                if parent.name == "node_modules":
                    found.append(parent)
                    break
    found += [Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent]
    return tuple(dict.fromkeys(found))


def prepare(plan: SandboxPlan, view: SandboxView, login_home: Path | None) -> None:
    """Make ``view``'s writable folders exist and belong to the sandbox user, the readable ones readable by
    it, and give the CLI's home a copy of the operator's Claude login (``~/.claude/.credentials.json``) when
    it has none or an older one."""
    view.cli_home.mkdir(parents=True, exist_ok=True)
    view.workspace.mkdir(parents=True, exist_ok=True)
    if login_home is not None:
        _copy_login(login_home, view.cli_home)
    if plan.user is None:
        return
    uid, gid = plan.user
    for root in (view.workspace, view.cli_home):
        if root.stat().st_uid != uid:
            _check_hand_over(root, view.home)
            _chown_tree(root, uid, gid)
    for folder in view.readable:
        if folder.is_dir():
            _share_read(folder, gid)


#: Where the Claude CLI keeps its login, under a home folder.
_LOGIN = PurePath(".claude", ".credentials.json")
#: A login file is a few hundred bytes; one past this is not copied.
_LOGIN_LIMIT = 1 << 20


def _copy_login(source_home: Path, cli_home: Path) -> None:
    """Copy the operator's login into the CLI home when it has none or an older one. The CLI home is the
    agent's: the login is written by replacing whatever is at that name (shared/safe_files.py), so a link
    the agent put there to a host file is replaced, not written through."""
    source = source_home / _LOGIN
    try:
        if source_home.resolve() == cli_home.resolve():
            return
        with open(source, "rb") as handle:  # the operator's own home: not the agent's to change
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                return
            mtime = os.fstat(handle.fileno()).st_mtime
            data = handle.read(_LOGIN_LIMIT + 1)
        if len(data) > _LOGIN_LIMIT:
            return
        existing = safe_files.stat_under(cli_home, _LOGIN)
        if existing is not None and stat.S_ISREG(existing.st_mode) and existing.st_mtime >= mtime:
            return
        safe_files.replace_under(cli_home, _LOGIN, data, 0o600)
    except safe_files.Refused as exc:
        log.warning("the Claude login was not copied into %s: %s", cli_home / _LOGIN, exc.reason)
    except OSError:
        pass  # no login to copy is what the CLI itself reports, in words the run's error explains


#: Folders of the system itself: never handed to an agent's user, nor anything under them.
SYSTEM_FOLDERS = tuple(
    Path(p) for p in ("/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/dev",
                      "/proc", "/sys", "/run", "/var/lib", "/var/log", "/var/spool", "/var/cache")
)  # fmt: skip


def hand_over_refusal(root: Path, home: Path | None) -> str | None:
    """Why ``root`` may not be given to an agent's user (None: it may). The settings file is the operator's
    and may name any folder as a workspace, a shared one with files in it included; but no setting makes
    agentpost give away the system (``workspace = "/etc"``: every file under it would become the agent's),
    the root folder, a home folder's top, or agentpost's own home or a folder above it."""
    real = Path(os.path.realpath(root))
    if home is not None:
        home_real = Path(os.path.realpath(home))
        if real == home_real or real in home_real.parents:
            return f"{root} holds agentpost's own home"
        if home_real in real.parents:
            return None
    if real == Path("/") or real.parent == Path("/"):
        return f"{root} is a top-level folder of the system"
    if any(real == folder or folder in real.parents for folder in SYSTEM_FOLDERS):
        return f"{root} is part of the system"
    if real.parent == Path("/home"):
        return f"{root} is a user's home folder"
    return None


def _check_hand_over(root: Path, home: Path | None) -> None:
    """Raise :class:`SandboxError`, saying what the operator can do, for a folder that may not be handed to
    an agent's user (:func:`hand_over_refusal`)."""
    why = hand_over_refusal(root, home)
    if why is not None:
        raise SandboxError(
            f"agentpost will not hand the folder {root} to an agent's user: {why}. Set [agents.…] workspace to "
            "a folder of its own (or leave it out: agentpost makes one under its home)"
        )


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    """Hand ``root`` to the sandbox user, never what a link in it points at (shared/safe_files.py)."""
    for kept in safe_files.chown_tree(root, uid, gid):
        log.warning("handing %s to %s: left %s with its owner", root, SANDBOX_USER, kept)


def _share_read(folder: Path, gid: int) -> None:
    """Let the sandbox user's group read an upload folder (the folder stays closed to everyone else)."""
    try:
        safe_files.share_read_tree(folder, gid)
    except OSError as exc:
        log.warning("could not share %s with %s: %s", folder, SANDBOX_USER, exc)


@dataclass(frozen=True)
class Sandboxed:
    """One run's sandbox: the plan and what the run may see. :meth:`wrap` turns the CLI's argv into the
    command that runs it inside."""

    plan: SandboxPlan
    view: SandboxView
    #: Whose Claude login (``~/.claude/.credentials.json``) the CLI's own home gets a copy of.
    login_home: Path | None = None

    def prepare(self) -> None:
        prepare(self.plan, self.view, self.login_home)

    def wrap(
        self, argv: Sequence[str], env: Mapping[str, str], template: Sequence[str] | None = None
    ) -> list[str]:
        """The command running ``argv`` inside. ``template`` is the agent's configured ``command`` (before
        its placeholders were filled in): only what comes from it, the program and the sandbox's entry are shown
        in the sandbox (:func:`configured_parts`), never a path the message's text put in ``argv``."""
        own = [sys.executable, str(_ENTRY), *configured_parts(argv, template)]
        shown = tool_paths(own, env, (self.view.workspace, self.view.cli_home))
        view = dataclasses.replace(self.view, tools=(*self.view.tools, *shown))
        return bwrap_argv(self.plan, view, argv)

    def environment(self, env: Mapping[str, str]) -> dict[str, str]:
        """The CLI's environment inside: its own HOME, a TMPDIR that exists there (``/tmp`` is empty), and
        the egress proxy as every proxy variable (the host's own proxy settings mean nothing inside)."""
        out = {**env, "HOME": str(self.view.cli_home), "TMPDIR": "/tmp"}
        if self.plan.network:
            for name in _PROXY_VARIABLES:
                out.pop(name, None)
            if self.view.egress is not None:
                proxy = f"http://127.0.0.1:{SANDBOX_PROXY_PORT}"
                for name in (
                    "HTTPS_PROXY",
                    "HTTP_PROXY",
                    "ALL_PROXY",
                    "https_proxy",
                    "http_proxy",
                    "all_proxy",
                ):
                    out[name] = proxy
        return out


class SandboxChoice:
    """The sandbox one processor runs agent CLIs in: chosen the first time it is needed, and again only when
    the mode asked for changes (an edit of ``[processor] sandbox``)."""

    def __init__(self) -> None:
        self._chosen: tuple[SandboxMode, SandboxPlan] | None = None

    def plan(self, configured: SandboxMode) -> SandboxPlan:
        """The plan for ``configured`` (``AGENTPOST_SANDBOX`` in this process's environment wins), logged
        with the reason when agents run unconfined. Raises :class:`SandboxError` when the first choice asks
        for namespaces that cannot be had here; a later change that cannot be had keeps the plan in force."""
        # AGENTPOST_SANDBOX is an operator's switch for one process; the test suite's scripted agents, which
        # report through files beside their script, run with it set to none, while tests/e2e/test_sandbox.py
        # runs them confined.
        override = os.environ.get("AGENTPOST_SANDBOX", "").strip()
        mode = configured
        if override:
            if override not in ("auto", "namespaces", "none"):
                raise SandboxError(f"AGENTPOST_SANDBOX={override!r}: use auto, namespaces or none")
            mode = override  # type: ignore[assignment]
        if self._chosen is not None and self._chosen[0] == mode:
            return self._chosen[1]
        try:
            plan = choose(mode)
        except SandboxError as exc:
            if self._chosen is None:
                raise
            log.warning("[processor] sandbox = %r not taken up, the sandbox in force stays: %s", mode, exc)
            return self._chosen[1]
        if plan.kind == "none":
            log.warning("agents run without a sandbox: %s", plan.reason)
        else:
            log.info("agents run in a sandbox: %s", plan.describe)
        self._chosen = (mode, plan)
        return plan
