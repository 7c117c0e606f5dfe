"""Who may translate on `mtrain serve`: API keys (`api_keys_file`) and a request rate
(`rate_limit_per_minute`), both off by default.

They guard the routes that translate: POST /translate, mtrain's API and LibreTranslate's alike
(and LibreTranslate's own path, serve.libretranslate.LIBRETRANSLATE_PATH); the page, /health
and /languages stay open, as LibreTranslate's do. A request names its key as LibreTranslate's
clients do, in the field `api_key` of its body (JSON or form), or in the query (`?api_key=`),
or in the header `Authorization: Bearer KEY` (mtrain's JSON API has no field for it).

- Keys: with `api_keys_file`, a request without a key gets 403 and one with a key not in the
  file 403 too. The file holds one key per line; blank lines and lines starting with `#` are
  skipped. It is read when the server starts (restart it to change the keys); only the keys'
  SHA-256 digests are kept, so a lookup takes the same time whatever the key.
- Rate: with `rate_limit_per_minute: N`, each key (a valid one; else the client's address,
  as the socket gives it: behind a proxy every client shares the proxy's) may send N
  requests at once and then one every 60/N s (a token bucket of N); one more gets 429 with
  a Retry-After header. Counted per server process, in memory.

Both answer in the server's error shape, `{"error": "..."}`, before the body is read by the
route (the ASGI middleware `AccessControl`).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Collection
from pathlib import Path
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.responses import JSONResponse

from mtrain.config import ServeConfig
from mtrain.errors import MtrainError

# The body's fields as LibreTranslate's handler read them (`serve.libretranslate`), in the
# request's ASGI state: its api_key counts like the header's.
BODY_FIELDS = "libretranslate"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def read_api_keys(path: Path) -> frozenset[str]:
    """The digests of the keys in `path` (one per line; blank lines and # comments skipped)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise MtrainError(f"api_keys_file: cannot read {path} ({error})") from None
    keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise MtrainError(f"api_keys_file: {path} holds no key (one per line); add one, or drop api_keys_file")
    return frozenset(digest(key) for key in keys)


class RateLimiter:
    """A token bucket of `per_minute` tokens per client, refilled at per_minute/60 a second."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute = per_minute
        self.rate = per_minute / 60.0
        self.clock = clock
        self.buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, when counted)

    def wait(self, client: str) -> float:
        """0 and one token taken when `client` may go on; else the seconds until it may."""
        now = self.clock()
        tokens, then = self.buckets.get(client, (float(self.per_minute), now))
        tokens = min(float(self.per_minute), tokens + (now - then) * self.rate)
        if len(self.buckets) > 100_000:  # clients seen once, long ago, hold full buckets: forget them
            self.forget_full(now)
        if tokens >= 1.0:
            self.buckets[client] = (tokens - 1.0, now)
            return 0.0
        self.buckets[client] = (tokens, now)
        return (1.0 - tokens) / self.rate

    def forget_full(self, now: float) -> None:
        full = [
            client
            for client, (tokens, then) in self.buckets.items()
            if tokens + (now - then) * self.rate >= self.per_minute
        ]
        for client in full:
            del self.buckets[client]


def request_key(scope: dict) -> str | None:
    """The API key a request names: its body's api_key, the query's, or a Bearer token."""
    fields = scope.get("state", {}).get(BODY_FIELDS)
    if isinstance(fields, dict) and isinstance(fields.get("api_key"), str) and fields["api_key"]:
        return fields["api_key"]
    query = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("api_key")
    if query and query[0]:
        return query[0]
    authorization = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return None


class AccessControl:
    """ASGI middleware: `keys` (digests; None: no keys needed) and `limiter` (None: no limit)
    for POST requests to `paths`."""

    def __init__(
        self, app: Callable, paths: Collection[str], keys: frozenset[str] | None, limiter: RateLimiter | None
    ) -> None:
        self.app = app
        self.paths = frozenset(paths)
        self.keys = keys
        self.limiter = limiter

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.paths:
            refused = self.refusal(scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: dict) -> JSONResponse | None:
        key = request_key(scope)
        if self.keys is not None:
            if key is None:
                return JSONResponse(
                    {
                        "error": "api_key: this server requires an API key; send it as api_key "
                        "(in the body or the query) or as the header Authorization: Bearer KEY"
                    },
                    status_code=403,
                )
            if digest(key) not in self.keys:
                return JSONResponse({"error": "api_key: invalid API key"}, status_code=403)
        if self.limiter is None:
            return None
        client = (
            f"key {digest(key)}" if self.keys is not None and key is not None else "address " + client_address(scope)
        )
        wait = self.limiter.wait(client)
        if wait <= 0:
            return None
        seconds = math.ceil(wait)
        who = "this API key" if client.startswith("key") else "this address"
        return JSONResponse(
            {
                "error": f"rate_limit_per_minute: over {self.limiter.per_minute} requests a minute from {who}; "
                f"retry in {seconds} s"
            },
            status_code=429,
            headers={"Retry-After": str(seconds)},
        )


def client_address(scope: dict) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def add_access_control(app: Starlette, cfg: ServeConfig, paths: Collection[str]) -> None:
    """Guard `paths` with `cfg`'s keys and rate, when either is set."""
    keys = read_api_keys(Path(cfg.api_keys_file)) if cfg.api_keys_file else None
    limiter = RateLimiter(cfg.rate_limit_per_minute) if cfg.rate_limit_per_minute > 0 else None
    if keys is not None or limiter is not None:
        app.add_middleware(AccessControl, paths=paths, keys=keys, limiter=limiter)
