"""Settings: ``$AGENTPOST_HOME/settings.toml`` validated into typed models, with environment overrides.

Every error names the file and the dotted key that is wrong (or, for a file that is not TOML, the line and
column), so an operator can fix it without reading code. The sections one process kind reads (``[processor]``,
``[scheduler]``, ``[heartbeats]``, ``[[schedules]]``, ``[channels.*]``) are validated here too, with the
models of :mod:`shared.settings.sections` and :mod:`shared.settings.channels` that those processes use, so
``doctor``, ``send`` or an edit refuse what the processor or an adapter would refuse when it starts.
:attr:`SettingsFile` keeps them as the raw tables; :class:`Settings` holds them validated.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from shared.settings.backup import BackupSettings
from shared.settings.hosts import parse_rule
from shared.settings.providers import ProviderKind
from shared.settings.routing import AGENT_NAME_RE, Team
from shared.settings.sections import (
    BudgetSettings,
    HeartbeatConfig,
    Heartbeats,
    ProcessorSettings,
    RetentionSettings,
    ScheduleConfig,
    SchedulerConfig,
    Schedules,
    VoiceSettings,
)

DEFAULT_API_PORT = 3777
SETTINGS_FILE = "settings.toml"

M = TypeVar("M", bound=BaseModel)


class SettingsError(Exception):
    """Raised for settings that cannot be used; the message names the file and the key (or the line).

    ``fix`` says in a few words what to do about it (``agentpost doctor`` shows it under the finding)."""

    def __init__(self, message: str, *, fix: str = "", problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fix = fix or "correct the setting named above"
        #: One ``dotted.key: what is wrong`` per problem, when the file's content is the cause.
        self.problems = problems


_FIX_KEYS = "correct the key(s) named above"
_FIX_PORT = "set AGENTPOST_API_PORT to a port number (1-65535), or unset it"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseSettings(_Strict):
    """Where the one shared database lives. Empty means ``sqlite:///$AGENTPOST_HOME/agentpost.db``."""

    url: str = ""
    busy_timeout_ms: int = Field(default=30_000, ge=0)


class ApiSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=DEFAULT_API_PORT, ge=1, le=65535)
    token: str = ""
    # With no token set (environment, this file or $AGENTPOST_HOME/api-token), answer loopback without one:
    # any program on this machine, an agent's commands included, may then drive the API. Off by default.
    allow_open_loopback: bool = False
    # Web pages on these origins (besides the server's own) may call the API: a separately hosted dashboard.
    allowed_origins: list[str] = Field(default_factory=list)
    # Bounded input: a body over this size is refused with 413 while it is read (a message holds at most
    # 200,000 characters of UTF-8, well under 1 MiB).
    max_body_bytes: int = Field(default=1_048_576, ge=1024, le=1 << 30)
    # A request head (request line and headers) must be complete this soon after the connection opens or
    # the previous response ends (uvicorn has no such limit: a slowloris client would hold a socket forever).
    header_timeout_seconds: float = Field(default=10.0, gt=0, le=3600)
    # A request body must arrive in full this soon after it was first read (slow-drip uploads are cut off).
    body_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)
    # An idle keep-alive connection is closed after this many seconds without a new request.
    idle_timeout_seconds: int = Field(default=5, ge=1, le=3600)
    # Open connections (including event streams) served at once; a request past the cap is answered 503.
    max_connections: int = Field(default=500, ge=1, le=100_000)

    @field_validator("allowed_origins")
    @classmethod
    def _origins_are_origins(cls, value: list[str]) -> list[str]:
        cleaned = []
        for origin in value:
            text = origin.strip().rstrip("/")
            scheme, sep, rest = text.partition("://")
            if text == "*":
                raise ValueError("'*' would let every web page in; list the origins to allow")
            if (
                not sep
                or scheme.lower() not in ("http", "https")
                or not rest
                or any(c in rest for c in "/?#@")
            ):
                raise ValueError(
                    f"{origin!r} is not an origin like 'https://office.example.com' or 'http://h:8080'"
                )
            cleaned.append(text)
        return cleaned


class QueueSettings(_Strict):
    default_agent: str = "assistant"
    max_retries: int = Field(default=5, ge=1, le=100)
    manual_retry_budget: int = Field(default=3, ge=0, le=100)
    lease_seconds: float = Field(default=30.0, gt=0)
    max_interrupted_runs: int = Field(default=10, ge=1, le=100)
    stall_ceiling_seconds: float = Field(default=600.0, gt=0)
    backoff_base_seconds: float = Field(default=2.0, ge=0)
    backoff_max_seconds: float = Field(default=300.0, ge=0)
    max_hops: int = Field(default=8, ge=0, le=64)
    max_chain_runs: int = Field(default=10, ge=1, le=1000)
    poll_interval_seconds: float = Field(default=5.0, gt=0)
    wake_interval_ms: int = Field(default=20, ge=1, le=5_000)
    # Chat channels hold a message this long (sliding with each new one) so a burst becomes one run.
    debounce_ms: int = Field(default=1_200, ge=0, le=60_000)

    # The queue counts in epoch milliseconds; these are the settings above in its unit.
    @property
    def lease_ms(self) -> int:
        """``lease_seconds`` in milliseconds."""
        return round(self.lease_seconds * 1000)

    @property
    def stall_ceiling_ms(self) -> int:
        """``stall_ceiling_seconds`` in milliseconds."""
        return round(self.stall_ceiling_seconds * 1000)


class EventSettings(_Strict):
    driver: Literal["sql", "memory", "redis"] = "sql"
    ttl_hours: float = Field(default=72.0, gt=0)
    max_per_topic: int = Field(default=100_000, ge=100)
    redis_url: str = "redis://127.0.0.1:6379/0"


_BYTE_SIZE = TypeAdapter(ByteSize)
_MIB = 1 << 20


def _size(value: object) -> int:
    """A size in settings: ``"512MiB"``, ``"2GiB"``, ``"1.5GB"`` (KB/MB/GB count in thousands, KiB/MiB/GiB in
    1024s) or a number of bytes; pydantic's ``ByteSize`` reads it, the refusal is in an operator's words."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a size like '512MiB', '2GiB', '1.5GB' or a number of bytes")
    try:
        return int(_BYTE_SIZE.validate_python(value))
    except ValidationError:
        raise ValueError(
            f"{value!r} is not a size like '512MiB', '2GiB', '1.5GB' or a number of bytes"
        ) from None


class AgentLimits(_Strict):
    """What one run of the agent may use; held by a cgroup or rlimits (workers/limits.py) that the run cannot
    lift. The defaults suit a claude run (about 250 MiB for the CLI, more for what its tools start)."""

    memory: Annotated[int, BeforeValidator(_size)] = 2 << 30
    processes: int = Field(default=256, ge=8, le=4_194_304)
    # The largest file one process of the run may write (RLIMIT_FSIZE): not the total of every file.
    disk: Annotated[int, BeforeValidator(_size)] = 5 << 30

    @field_validator("memory")
    @classmethod
    def _memory_floor(cls, value: int) -> int:
        if value < 64 * _MIB:
            raise ValueError(f"{value} bytes is less than 64 MiB, too little for an agent's CLI to start")
        return value

    @field_validator("disk")
    @classmethod
    def _disk_floor(cls, value: int) -> int:
        if value < _MIB:
            raise ValueError(
                f"{value} bytes is less than 1 MiB, too little for an agent's CLI to keep its session"
            )
        return value


class AgentSettings(_Strict):
    """One agent: which CLI runs it and how."""

    name: str = ""
    provider: ProviderKind = "claude"
    model: str = ""
    fallback_model: str = ""
    system_prompt: str = ""
    # "ask": every tool use the CLI would ask a person about is asked in the chat the message came from, and
    # the run waits for the answer (claude agents; workers/approvals.py).
    permission_mode: Literal["default", "acceptEdits", "bypassPermissions", "dontAsk", "plan", "ask"] = (
        "acceptEdits"
    )
    # One private CLI conversation per chat by default; "agent" shares one across every chat (opt-in).
    session_scope: Literal["agent", "conversation"] = "conversation"
    timeout_seconds: float = Field(default=1800.0, gt=0)
    command: list[str] = Field(default_factory=list)
    workspace: str = ""
    # The workspace is on storage every processor host sees (NFS, a cluster file system): a processor on
    # any host may run the agent there. Otherwise only a host that has the workspace runs it (see
    # workers/workspace.py and docs/restarts.md, "Standby processors").
    workspace_shared: bool = False
    env: dict[str, str] = Field(default_factory=dict)
    # Where the agent's runs may connect besides its AI service (workers/egress_policy.py): host names
    # ("github.com", "*.pypi.org", "127.0.0.1:8080"), or "open" for every public address.
    network: list[str] | Literal["open"] = Field(default_factory=list)
    limits: AgentLimits = Field(default_factory=AgentLimits)

    @field_validator("network")
    @classmethod
    def _network_names_hosts(cls, value: list[str] | str) -> list[str] | str:
        if isinstance(value, str):
            return value
        return [str(parse_rule(entry)) for entry in value]

    @model_validator(mode="after")
    def _command_needs_argv(self) -> AgentSettings:
        if self.provider == "command" and not self.command:
            raise ValueError("provider 'command' needs a non-empty 'command' argv list")
        return self


class TeamSettings(_Strict):
    name: str = ""
    agents: list[str]
    leader: str

    @model_validator(mode="after")
    def _leader_in_team(self) -> TeamSettings:
        for agent in self.agents:
            if not AGENT_NAME_RE.match(agent):
                raise ValueError(f"agent name {agent!r} must match {AGENT_NAME_RE.pattern}")
        if self.leader not in self.agents:
            raise ValueError(f"leader {self.leader!r} is not one of the team's agents {self.agents}")
        return self


class SettingsFile(_Strict):
    """The validated shape of settings.toml (environment overrides not yet applied)."""

    database: DatabaseSettings = DatabaseSettings()
    api: ApiSettings = ApiSettings()
    queue: QueueSettings = QueueSettings()
    events: EventSettings = EventSettings()
    retention: RetentionSettings = RetentionSettings()
    agents: dict[str, AgentSettings] = Field(default_factory=dict)
    teams: dict[str, TeamSettings] = Field(default_factory=dict)
    workspace_dir: str = ""
    # Read by one process kind each; validated into Settings.processor, .scheduler, ... (see Settings).
    processor: dict[str, Any] = Field(default_factory=dict)
    channels: dict[str, Any] = Field(default_factory=dict)
    scheduler: dict[str, Any] = Field(default_factory=dict)
    heartbeats: dict[str, Any] = Field(default_factory=dict)
    schedules: list[dict[str, Any]] = Field(default_factory=list)
    budgets: dict[str, Any] = Field(default_factory=dict)
    backup: BackupSettings = BackupSettings()
    voice: dict[str, Any] = Field(default_factory=dict)

    @field_validator("agents", "teams")
    @classmethod
    def _names_are_valid(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not AGENT_NAME_RE.match(name):
                raise ValueError(f"name {name!r} must match {AGENT_NAME_RE.pattern}")
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> SettingsFile:
        for team_name, team in self.teams.items():
            if team_name in self.agents:
                raise ValueError(f"team {team_name!r} has the same name as an agent")
            for agent in team.agents:
                if self.agents and agent not in self.agents:
                    raise ValueError(f"team {team_name!r} names unknown agent {agent!r}")
        return self


class Settings:
    """Settings in force for this process: the file, then the environment on top."""

    def __init__(self, home: Path, data: SettingsFile, path: Path, env: Mapping[str, str]) -> None:
        self.home = home
        self.path = path
        self.file = data
        self._env = env
        self.database_url = env.get("AGENTPOST_DATABASE_URL") or data.database.url or default_sqlite_url(home)
        port_text = env.get("AGENTPOST_API_PORT")
        port = data.api.port
        if port_text:
            try:
                port = int(port_text)
            except ValueError:
                raise SettingsError(
                    f"environment AGENTPOST_API_PORT={port_text!r} is not a port number", fix=_FIX_PORT
                ) from None
            if not 1 <= port <= 65535:
                raise SettingsError(
                    f"environment AGENTPOST_API_PORT={port} is outside 1..65535", fix=_FIX_PORT
                )
        api_fields = data.api.model_dump() | {
            "host": env.get("AGENTPOST_API_HOST") or data.api.host,
            "port": port,
            # An empty variable is as good as unset: no token is chosen with allow_open_loopback, not by this.
            "token": env.get("AGENTPOST_API_TOKEN") or data.api.token,
        }
        origins_text = env.get("AGENTPOST_API_ALLOWED_ORIGINS")
        if origins_text is not None:  # comma-separated; set but empty allows none beyond the server's own
            api_fields["allowed_origins"] = [o for o in (p.strip() for p in origins_text.split(",")) if o]
        try:
            self.api = ApiSettings.model_validate(api_fields)
        except ValidationError as exc:
            message = str(_invalid(path, _problems(exc, prefix="api")))
            if origins_text is not None:
                message += (
                    f"\n  (api.allowed_origins came from AGENTPOST_API_ALLOWED_ORIGINS={origins_text!r})"
                )
            raise SettingsError(message, fix=_FIX_KEYS) from None
        self.events = data.events.model_copy(
            update={"redis_url": env.get("AGENTPOST_REDIS_URL") or data.events.redis_url}
        )
        self.queue = data.queue
        #: ``[retention]``: how long each kind of finished history is kept (the scheduler prunes it).
        self.retention: RetentionSettings = data.retention
        self.agents: dict[str, AgentSettings] = dict(data.agents) or {
            data.queue.default_agent: AgentSettings(name="Assistant")
        }
        if self.queue.default_agent not in self.agents:
            raise SettingsError(
                f"{path}: queue.default_agent = {self.queue.default_agent!r} is not an agent "
                f"(known: {', '.join(sorted(self.agents))})",
                fix=_FIX_KEYS,
            )
        self.teams = {
            name: Team(name=name, agents=tuple(t.agents), leader=t.leader) for name, t in data.teams.items()
        }
        self.workspace_dir = (
            home / Path(data.workspace_dir).expanduser() if data.workspace_dir else home / "workspace"
        )
        self._validate_sections()

    def _validate_sections(self) -> None:
        """Validate the sections the processes read, all of them, and raise one error listing every
        problem (so ``doctor`` shows them at once)."""
        problems: list[str] = []

        def take(name: str, model: type[M], raw: Any) -> M | None:
            try:
                return model.model_validate(raw)
            except ValidationError as exc:
                problems.extend(_problems(exc, prefix=name))
                return None

        data = self.file
        processor = take("processor", ProcessorSettings, data.processor)
        scheduler = take("scheduler", SchedulerConfig, data.scheduler)
        beats = take("heartbeats", Heartbeats, data.heartbeats)
        schedules = take("schedules", Schedules, data.schedules)
        budgets = take("budgets", BudgetSettings, data.budgets)
        voice = take("voice", VoiceSettings, data.voice)
        channels: dict[str, BaseModel] = {}
        if data.channels:
            # Only a file with channel sections pays for building the channels' models (every CLI command
            # loads the settings; most homes have none).
            from shared.settings.channels import channel_model

            for name, raw in data.channels.items():
                if not isinstance(raw, dict):
                    problems.append(f"channels.{name}: must be a table ([channels.{name}])")
                    continue
                model = channel_model(name)
                section = take(f"channels.{name}", model, raw) if model is not None else None
                if section is not None:
                    channels[name] = section
        known = ", ".join(sorted(self.agents))
        for agent in processor.agents if processor is not None else []:
            if agent not in self.agents:
                problems.append(f"processor.agents: unknown agent {agent!r} (known: {known})")
        for agent in beats.root if beats is not None else {}:
            if agent not in self.agents:
                problems.append(f"heartbeats.{agent}: unknown agent (known: {known})")
        seen: set[str] = set()
        for i, entry in enumerate(schedules.root if schedules is not None else []):
            if entry.agent not in self.agents and entry.agent not in self.teams:
                problems.append(f"schedules.{i}.agent: unknown agent or team {entry.agent!r}")
            elif entry.key in seen:
                problems.append(
                    f"schedules.{i}: two schedules are the same ({entry.key!r}); give them different names"
                )
            seen.add(entry.key)
        kept_days = data.retention.messages_days
        if (
            scheduler is not None
            and kept_days is not None
            and scheduler.catchup_seconds >= kept_days * 86_400
        ):
            # A missed slot is refused a second time only while its message is still kept.
            problems.append("retention.messages_days: must be longer than scheduler.catchup_seconds")
        if (
            problems
            or processor is None
            or scheduler is None
            or beats is None
            or schedules is None
            or (budgets is None)
            or voice is None
        ):
            raise _invalid(self.path, problems)
        self.processor: ProcessorSettings = processor
        self.scheduler: SchedulerConfig = scheduler
        self.heartbeats: dict[str, HeartbeatConfig] = beats.root
        self.schedules: list[ScheduleConfig] = schedules.root
        #: ``[budgets]``: spending limits per sender and agent (read afresh by the processor, see
        #: :mod:`workers.budgets`).
        self.budgets: BudgetSettings = budgets
        #: ``[voice]``: the speech-to-text service voice notes are transcribed by (:mod:`adapters.voice`).
        self.voice: VoiceSettings = voice
        #: The ``[channels.<name>]`` sections present, each validated with its channel's model.
        self.channels: dict[str, BaseModel] = channels

    @property
    def env(self) -> Mapping[str, str]:
        """The environment these settings were read with (secrets come from here)."""
        return self._env

    def section(self, name: str, model: type[M]) -> M:
        """Validate one section (``processor``, ``channels``, ...) into ``model``: for a plugin with a
        model of its own. The built-in sections were validated when the settings were loaded
        (:attr:`processor`, :attr:`scheduler`, :attr:`heartbeats`, :attr:`schedules`, :attr:`channels`)."""
        raw = getattr(self.file, name)
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            raise _invalid(self.path, _problems(exc, prefix=name)) from None

    def workspace(self, agent: str) -> Path:
        """The working folder of one agent."""
        configured = self.agents[agent].workspace if agent in self.agents else ""
        if not configured:
            return self.workspace_dir / agent
        # A relative path is relative to the home folder, not to wherever a process was started from.
        path = Path(configured).expanduser()
        return path if path.is_absolute() else self.home / path


def default_home(env: Mapping[str, str] | None = None) -> Path:
    """``$AGENTPOST_HOME``, or ``~/.agentpost``."""
    env = os.environ if env is None else env
    home = env.get("AGENTPOST_HOME")
    return Path(home).expanduser() if home else Path.home() / ".agentpost"


def default_sqlite_url(home: Path) -> str:
    return f"sqlite:///{home / 'agentpost.db'}"


def _problems(exc: ValidationError, prefix: str = "") -> list[str]:
    """One ``dotted.key: what is wrong`` line per error."""
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"])
        if prefix:
            key = f"{prefix}.{key}" if key else prefix
        message = err["msg"]
        if err["type"] == "extra_forbidden":
            message = "unknown key (check its spelling)"
        lines.append(f"{key or '(top level)'}: {message}")
    return lines


def _invalid(path: Path, problems: list[str]) -> SettingsError:
    return SettingsError(
        f"invalid settings in {path}:\n  " + "\n  ".join(problems), fix=_FIX_KEYS, problems=tuple(problems)
    )


#: Where tomllib (Python 3.11-3.13) puts the position in its message.
_TOML_AT = re.compile(
    r"^(?P<msg>.*) \(at (?:line (?P<line>\d+), column (?P<col>\d+)|end of document)\)$", re.S
)
#: tomllib's terse messages, in the words of someone editing the file.
_TOML_HINTS = {
    "Invalid value": 'a value is missing or malformed (text needs quotes: key = "text")',
    "Cannot overwrite a value": "this key or table is set twice",
    "Cannot declare": "this table is declared twice",
    "Illegal character '\\n'": "the line ends inside a quoted text (is a closing quote missing?)",
    "Expected newline or end of document after a statement": (
        'unexpected text after the value (text needs quotes: key = "text")'
    ),
}


def toml_error(path: Path, text: str, exc: tomllib.TOMLDecodeError) -> SettingsError:
    """A syntax error as a person fixes it: the line and column, that line's text and a caret under the
    column. At the end of the file (a value or a bracket missing) the last line with text is shown."""
    message = str(exc)
    line_no: int | None = getattr(exc, "lineno", None)  # Python 3.14+ carries the position itself
    col: int | None = getattr(exc, "colno", None)
    what = getattr(exc, "msg", "") if line_no else ""
    match = _TOML_AT.match(message)
    if not what and match:
        what = match["msg"]
        if match["line"]:
            line_no, col = int(match["line"]), int(match["col"])
        else:
            line_no = 0
    lines = text.splitlines()
    at_end = line_no == 0 or (line_no is not None and line_no > len(lines))
    if at_end:
        written = [i for i, line in enumerate(lines, 1) if line.strip()]
        line_no = written[-1] if written else 1
        col = len(lines[line_no - 1]) + 1 if lines else 1
    if line_no is None or col is None:  # a message whose form we do not know: shown as it is
        return SettingsError(f"{path} is not valid TOML: {message}", fix=f"fix the TOML syntax in {path}")
    hint = next((h for start, h in _TOML_HINTS.items() if what.startswith(start)), "")
    where = f"line {line_no}, column {col}" + (" (the end of the file)" if at_end else "")
    source = lines[line_no - 1].replace("\t", " ") if line_no <= len(lines) else ""
    gutter = " " * len(str(line_no))
    return SettingsError(
        f"{path} is not valid TOML at {where}: {hint or what}\n"
        f"  {line_no} | {source}\n  {gutter} | {' ' * (col - 1)}^",
        fix=f"fix the TOML syntax on line {line_no} of {path}",
    )


def load_settings(home: Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """Read and validate the settings of ``home`` (default: :func:`default_home`).

    A missing file means all defaults. Raises :class:`SettingsError` naming the file and key on bad input.
    """
    env = dict(os.environ) if env is None else dict(env)
    home = home or default_home(env)
    path = home / SETTINGS_FILE
    text = ""
    if path.exists():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
            raise SettingsError(
                f"cannot read {path}: {reason}", fix=f"make {path} a readable UTF-8 text file"
            ) from None
    return parse_settings(home, path, text, env)


def parse_settings(home: Path, path: Path, text: str, env: Mapping[str, str]) -> Settings:
    """The settings ``text`` (the content of ``path``) stands for, validated as every process validates
    them: the one check :func:`load_settings` and an edit (:mod:`shared.settings.edit`) go through."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise toml_error(path, text, exc) from None
    try:
        data = SettingsFile.model_validate(raw)
    except ValidationError as exc:
        raise _invalid(path, _problems(exc)) from None
    return Settings(home=home, data=data, path=path, env=env)
