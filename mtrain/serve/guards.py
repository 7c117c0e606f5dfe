"""What `mtrain serve` trusts of a request's headers, and what it tells browsers: the client's
address behind a reverse proxy, the Host allow-list, CORS and the headers against framing.

- Client address (`trusted_proxies`): the socket's peer, always, unless that peer is one of the
  proxies the operator named (addresses or networks): then the right-most address of
  `X-Forwarded-For` that is not itself a trusted proxy, the one the last trusted proxy saw.
  Only the last FORWARDED_HOPS entries are read (proxies append at the end; a client's own
  thousands of entries in front are neither parsed nor believed).
  uvicorn's own proxy-header handling is off (it trusts 127.0.0.1 by default, so behind a local
  proxy, or from this machine, any client could pick its address and so its rate limit).
- Host allow-list (`allowed_hosts`): a request whose Host header names another host gets 400, so
  that a web page whose DNS name is rebound to 127.0.0.1 cannot call a local server. By default
  it is on when the server is bound to a loopback address (localhost, 127.0.0.1 and ::1, any
  port) and off otherwise; a list replaces it ("*" any host, "*.example.org" its subdomains).
  A Host that is no `name[:port]` or `[IPv6][:port]` (userinfo as in `evil.com@mt.example.org`,
  a path, spaces) is refused whatever the list: it would otherwise end in an allowed suffix.
- CORS (`cors_origins`): off unless set. A request from a listed origin (or any, with "*") gets
  Access-Control-Allow-Origin, and a preflight (OPTIONS with Access-Control-Request-Method)
  from it 204 with the methods (GET, POST) and headers (Content-Type, Authorization) the APIs
  take; a preflight from another origin gets 403. No cookies are involved: keys are sent in the
  body, the query or the Authorization header, so credentials are never allowed.
- Every answer carries `X-Frame-Options: DENY`, `X-Content-Type-Options: nosniff` and a
  Content-Security-Policy with `frame-ancestors 'none'` (the page's own policy has it too).

The settings are read once (`browser_rules`, `proxies`), before the model loads: a wrong entry
is one line naming the key.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

from starlette.applications import Starlette

from mtrain.config import ServeConfig
from mtrain.errors import MtrainError
from mtrain.serve.protocol import SECURITY_HEADERS, ASGIApp, Message, Receive, Scope, Send, header, send_error

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
CORS_METHODS = "GET, POST"
CORS_HEADERS = "Content-Type, Authorization"
FORWARDED_HOPS = 16  # X-Forwarded-For entries read from its end: more proxies than any deployment chains
# A DNS name or IPv4 address: dot-separated labels of letters, digits, hyphens (underscores: some
# internal names have them), none empty, a trailing dot allowed; then an optional port.
_HOST_NAME = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*\.?")
_PORT = re.compile(r"[0-9]{0,5}")  # (RFC 3986: a port may be empty, `host:`)


# ------------------------------------------------------------------ the settings
def proxies(entries: Sequence[str]) -> list[Network]:
    """`trusted_proxies` as networks (an address is a network of one); MtrainError naming the entry."""
    networks = []
    for entry in entries:
        try:
            networks.append(ipaddress.ip_network(str(entry).strip(), strict=False))
        except ValueError:
            raise MtrainError(
                f"trusted_proxies: {entry!r} is not an IP address or network (such as 127.0.0.1 or 10.0.0.0/8)"
            ) from None
    return networks


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_patterns(cfg: ServeConfig) -> list[str] | None:
    """The Host names the server answers (lower case, no port), or None for any."""
    if cfg.allowed_hosts is None:
        return list(LOOPBACK_NAMES) if is_loopback(cfg.host) else None
    if not cfg.allowed_hosts:
        raise MtrainError(
            "allowed_hosts: [] allows no host; list the names clients use (e.g. [translate.example.org]), "
            "[*] for any, or null (the default)"
        )
    patterns = []
    for entry in cfg.allowed_hosts:
        name = str(entry).strip().lower()
        if not name or "/" in name or (name.count(":") == 1 and not name.startswith("[")):
            raise MtrainError(
                f"allowed_hosts: {entry!r} is not a host name; give names without scheme or port "
                "(translate.example.org, *.example.org, 127.0.0.1, ::1, or * for any)"
            )
        patterns.append(name.strip("[]"))
    return None if "*" in patterns else patterns


def origins(cfg: ServeConfig) -> list[str]:
    """`cors_origins` as browsers send Origin (scheme://host[:port]); MtrainError naming the entry."""
    checked = []
    for entry in cfg.cors_origins:
        origin = str(entry).strip()
        scheme, _, rest = origin.partition("://")
        if origin != "*" and (scheme not in ("http", "https") or not rest or "/" in rest):
            raise MtrainError(
                f"cors_origins: {entry!r} is not a web origin; give scheme://host[:port] without a path "
                "(https://app.example.org) or * for any"
            )
        checked.append(origin)
    return checked


# ------------------------------------------------------------------ the middleware
def host_of(value: bytes) -> str | None:
    """The host of a Host header, lower case, without its port, IPv6 brackets or a trailing dot;
    None when the header is no `host[:port]` (userinfo, a path, spaces, an empty label...)."""
    text = value.decode("latin-1").strip().lower()
    if text.startswith("["):
        address, closed, rest = text[1:].partition("]")
        port_ok = rest == "" or (rest.startswith(":") and _PORT.fullmatch(rest[1:]) is not None)
        return address if closed and port_ok and _is_ipv6(address) else None
    if text.count(":") > 1:  # an IPv6 address without brackets, as some clients send it
        return text if _is_ipv6(text) else None
    name, colon, port = text.partition(":")
    if (colon and _PORT.fullmatch(port) is None) or _HOST_NAME.fullmatch(name) is None:
        return None
    return name.removesuffix(".")


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def host_allowed(host: str, patterns: Sequence[str]) -> bool:
    return any(host == p or (p.startswith("*.") and host.endswith(p[1:])) for p in patterns)


@dataclass
class ClientBehindProxies:
    """ASGI middleware: scope["client"] is X-Forwarded-For's client when the peer is a trusted proxy."""

    app: ASGIApp
    networks: list[Network]

    def trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.strip().strip("[]"))
        except ValueError:
            return False
        return any(ip in network for network in self.networks)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        if scope["type"] == "http" and client and self.trusted(str(client[0])):
            values = [value for name, value in scope["headers"] if name.lower() == b"x-forwarded-for"]
            # Each proxy appends the address it saw: the last one no trusted proxy wrote is the
            # client. Only the last FORWARDED_HOPS entries can be a trusted proxy's; the rest is unread.
            last_hops = b",".join(values).rsplit(b",", FORWARDED_HOPS)[-FORWARDED_HOPS:]
            forwarded = [address.decode("latin-1").strip() for address in last_hops]
            untrusted = [address for address in forwarded if address and not self.trusted(address)]
            if untrusted:
                scope["client"] = (untrusted[-1], 0)
        await self.app(scope, receive, send)


@dataclass
class HostCheck:
    """ASGI middleware: 400 for a request whose Host is not one of `patterns`."""

    app: ASGIApp
    patterns: list[str]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            value = header(scope, b"host")
            host = host_of(value) if value is not None else None
            if host is None or not host_allowed(host, self.patterns):
                shown = "missing" if value is None else repr(value.decode("latin-1")[:80])
                allowed = ", ".join(self.patterns)
                await send_error(
                    send,
                    400,
                    f"Host: {shown} is not a name this server answers to (allowed_hosts: {allowed}); "
                    "use one of them, or set allowed_hosts",
                )
                return
        await self.app(scope, receive, send)


@dataclass
class Cors:
    """ASGI middleware: CORS for `allowed` origins ("*": any)."""

    app: ASGIApp
    allowed: list[str]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origin = header(scope, b"origin") if scope["type"] == "http" else None
        if origin is None:
            await self.app(scope, receive, send)
            return
        name = origin.decode("latin-1")
        allowed = "*" in self.allowed or name in self.allowed
        if scope["method"] == "OPTIONS" and header(scope, b"access-control-request-method") is not None:
            if not allowed:
                await send_error(send, 403, f"Origin: {name[:80]!r} is not in cors_origins")
                return
            headers = [
                *self.allow_origin(name),
                (b"access-control-allow-methods", CORS_METHODS.encode()),
                (b"access-control-allow-headers", CORS_HEADERS.encode()),
                (b"access-control-max-age", b"600"),
                (b"content-length", b"0"),
            ]
            await send({"type": "http.response.start", "status": 204, "headers": headers})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await self.app(scope, receive, with_headers(send, self.allow_origin(name) if allowed else []))

    def allow_origin(self, origin: str) -> list[tuple[bytes, bytes]]:
        if "*" in self.allowed:
            return [(b"access-control-allow-origin", b"*")]
        return [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]


def with_headers(send: Send, extra: list[tuple[bytes, bytes]]) -> Send:
    """`send` that adds `extra` to the answer's head (a header the answer has already is kept)."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start" and extra:
            present = {bytes(name).lower() for name, _ in message.get("headers", [])}
            added = [(name, value) for name, value in extra if name not in present]
            message = {**message, "headers": [*message.get("headers", []), *added]}
        await send(message)

    return sending


class SecurityHeaders:
    """ASGI middleware: every answer says it may not be framed or content-sniffed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, with_headers(send, SECURITY_HEADERS))


def add_browser_rules(app: Starlette, cfg: ServeConfig) -> None:
    """Under the body's limits: the Host allow-list, CORS and the client's address (see above)."""
    allowed_origins = origins(cfg)
    if allowed_origins:
        app.add_middleware(Cors, allowed=allowed_origins)
    patterns = host_patterns(cfg)
    if patterns is not None:
        app.add_middleware(HostCheck, patterns=patterns)
    networks = proxies(cfg.trusted_proxies)
    if networks:
        app.add_middleware(ClientBehindProxies, networks=networks)


def check_browser_rules(cfg: ServeConfig) -> None:
    """The settings above read once, for their one-line errors before the model loads."""
    proxies(cfg.trusted_proxies)
    host_patterns(cfg)
    origins(cfg)
