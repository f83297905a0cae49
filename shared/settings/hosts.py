"""Host names as an operator writes them in ``[agents.X] network``: ``github.com``, ``*.pypi.org``,
``127.0.0.1:8080``, ``[::1]:8080`` — parsed once here, for the settings' validation and the egress proxy's rule
(:mod:`workers.egress_policy`)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

#: Ports a host named without one may be reached on.
WEB_PORTS = (443, 80)


def normalize_host(host: str) -> str:
    """A host name as compared here: lower case, no brackets around an IPv6 address, no trailing dot."""
    return host.strip().strip("[]").rstrip(".").lower()


@dataclass(frozen=True)
class HostRule:
    """One allowed destination: a host (``*.example.com`` for any name under it) and a port (None: 443
    and 80)."""

    host: str
    port: int | None = None

    @property
    def wildcard(self) -> bool:
        return self.host.startswith("*.")

    def matches(self, host: str, port: int) -> bool:
        if self.port is None:
            if port not in WEB_PORTS:
                return False
        elif port != self.port:
            return False
        if self.wildcard:
            return host.endswith(self.host[1:])
        return host == self.host

    def names_exactly(self, host: str, port: int) -> bool:
        """Whether this rule names ``host:port`` itself — what a local or private address needs."""
        return not self.wildcard and self.port == port and host == self.host

    def __str__(self) -> str:
        return self.host if self.port is None else f"{bracketed(self.host)}:{self.port}"


def bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_rule(text: str) -> HostRule:
    """``github.com``, ``*.pypi.org``, ``127.0.0.1:8080``, ``[::1]:8080``; raises ValueError saying what is
    wrong."""
    raw = text.strip()
    if not raw or any(c.isspace() for c in raw) or "/" in raw or "@" in raw:
        raise ValueError(f"{text!r} is not a host name like 'github.com', '*.pypi.org' or 'host:8080'")
    host, port = raw, None
    if raw.startswith("["):
        inside, sep, rest = raw[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r}: write an IPv6 address as '[::1]:8080'")
        host, port_text = inside, rest[1:]
        port = _port(text, port_text) if rest else None
    elif raw.count(":") == 1:
        host, port_text = raw.split(":")
        port = _port(text, port_text)
    elif raw.count(":") > 1:
        raise ValueError(f"{text!r}: write an IPv6 address as '[::1]:8080'")
    host = normalize_host(host)
    label = host[2:] if host.startswith("*.") else host
    if not label or "*" in label or label.startswith(".") or ".." in label:
        raise ValueError(f"{text!r}: a wildcard is only allowed as the first label ('*.example.com')")
    return HostRule(host, port)


def _port(text: str, port_text: str) -> int:
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    return int(port_text)


def rule_from_url(url: str) -> HostRule | None:
    """The exact ``host:port`` a base URL points at (None when it names no host)."""
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    default = 443 if parts.scheme == "https" else 80
    return HostRule(normalize_host(parts.hostname), port or default)
