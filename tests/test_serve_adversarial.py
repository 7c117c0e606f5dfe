"""`mtrain serve` against a careless or hostile client (issue 49's server cases), through the real
server process as tests/test_serve.py starts it: a spoofed X-Forwarded-For, guessed API keys, a
keys file written on Windows, framing, DNS rebinding (a foreign Host), CORS, numbers that are no
numbers. Each case asserts the status and the one-line message."""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from mtrain.config import ServeConfig
from mtrain.errors import MtrainError
from mtrain.serve.access import FAILED_KEY_DELAY_S, FAILED_KEYS_PER_MINUTE
from mtrain.serve.guards import (
    FORWARDED_HOPS,
    ClientBehindProxies,
    HostCheck,
    check_browser_rules,
    host_patterns,
    proxies,
)
from tests.servers import DECODE, ENV, Server
from tests.warm_process import run_mtrain

TRANSLATE = {"text": ["Ein Hund."]}
LIBRE = {"q": "Ein Hund.", "source": "de", "target": "en"}
FRAMING = {"x-frame-options": "DENY", "x-content-type-options": "nosniff"}


@pytest.fixture(scope="module")
def limited(run_dir, tmp_path_factory):
    """Two requests a minute per client; no proxy trusted (the default)."""
    started = Server(f"run={run_dir}", *DECODE, "rate_limit_per_minute=2", cwd=tmp_path_factory.mktemp("limited"))
    yield started
    assert started.stop() == 0, started.stderr()


@pytest.fixture(scope="module")
def proxied(run_dir, tmp_path_factory):
    """Two requests a minute per client behind a proxy on 127.0.0.1, reached as translate.example."""
    started = Server(
        f"run={run_dir}",
        *DECODE,
        "rate_limit_per_minute=2",
        "trusted_proxies=[127.0.0.1]",
        "allowed_hosts=[translate.example,127.0.0.1]",
        cwd=tmp_path_factory.mktemp("proxied"),
    )
    yield started
    assert started.stop() == 0, started.stderr()


@pytest.fixture(scope="module")
def guarded(run_dir, tmp_path_factory):
    """API keys from a file written on Windows (a byte order mark, CRLF), a page on
    https://app.example calling the API (CORS), the default Host allow-list (loopback)."""
    cwd = tmp_path_factory.mktemp("guarded")
    keys = cwd / "keys.txt"
    keys.write_bytes("key-one\r\nkey-two\r\n".encode("utf-8-sig"))
    started = Server(
        f"run={run_dir}",
        *DECODE,
        "max_beam=4",
        f"api_keys_file={keys}",
        "cors_origins=[https://app.example]",
        cwd=cwd,
    )
    yield started
    assert started.stop() == 0, started.stderr()
    assert "Traceback" not in started.stderr()


def statuses(server: Server, forwarded_for: list[str]) -> list[int]:
    return [server.post(TRANSLATE, headers={"X-Forwarded-For": address}).status_code for address in forwarded_for]


# ------------------------------------------------------------------ the client's address
def test_a_spoofed_x_forwarded_for_does_not_escape_the_rate_limit(limited):
    """Before: 6 x 200, each request naming another address (uvicorn trusted 127.0.0.1)."""
    assert statuses(limited, [f"10.0.0.{i}" for i in range(6)]) == [200, 200, 429, 429, 429, 429]
    refused = limited.post(TRANSLATE, headers={"X-Forwarded-For": "10.0.0.99"})
    assert refused.status_code == 429
    assert refused.json()["error"].startswith("rate_limit_per_minute: over 2 requests a minute from this address")


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_limit(proxied):
    assert statuses(proxied, [f"10.0.0.{i}" for i in range(6)]) == [200] * 6
    assert statuses(proxied, ["10.0.1.1"] * 3) == [200, 200, 429]
    # A client's own X-Forwarded-For is kept by a proxy that appends: the address the proxy saw counts.
    assert statuses(proxied, [f"6.6.6.{i}, 10.0.1.2" for i in range(3)]) == [200, 200, 429]


def test_a_host_outside_allowed_hosts_is_400(proxied):
    assert httpx.get(f"{proxied.url}/health", headers={"Host": "translate.example:8080"}).status_code == 200
    refused = httpx.get(f"{proxied.url}/health", headers={"Host": "localhost"})
    assert (refused.status_code, refused.json()) == (
        400,
        {
            "error": "Host: 'localhost' is not a name this server answers to (allowed_hosts: "
            "translate.example, 127.0.0.1); use one of them, or set allowed_hosts"
        },
    )


# ------------------------------------------------------------------ keys, framing, rebinding, CORS
def test_keys_from_a_file_with_a_byte_order_mark_and_crlf(guarded):
    """Before: the first key got 403 (the BOM became part of it)."""
    for key in ("key-one", "key-two"):
        answer = guarded.post(TRANSLATE, headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == 200, answer.text
    libre = httpx.post(f"{guarded.url}/translate", data={**LIBRE, "api_key": "key-one"}, timeout=60)
    assert libre.status_code == 200, libre.text


def test_every_answer_forbids_framing_and_sniffing(guarded):
    """Before: no X-Frame-Options, no frame-ancestors, no nosniff."""
    page = httpx.get(f"{guarded.url}/")
    assert page.status_code == 200 and "<textarea" in page.text
    policy = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy  # one policy, merged
    answers = [
        page,
        httpx.get(f"{guarded.url}/health"),
        httpx.get(f"{guarded.url}/languages"),
        httpx.get(f"{guarded.url}/no-such-route"),
        guarded.post(TRANSLATE, headers={"Authorization": "Bearer key-one"}),
        guarded.post(TRANSLATE),  # 403: no key
        guarded.post(content=b"x" * 2_000_000),  # 413 (max_request_bytes)
    ]
    assert [answer.status_code for answer in answers] == [200, 200, 200, 404, 200, 403, 413]
    for answer in answers:
        assert {name: answer.headers.get(name) for name in FRAMING} == FRAMING, answer.request.url
        assert "frame-ancestors 'none'" in answer.headers["content-security-policy"]


def test_a_foreign_host_is_400_on_a_loopback_server(guarded):
    """Before: any Host was answered (a page on a rebound DNS name could call the server)."""
    port = guarded.url.rsplit(":", 1)[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "LOCALHOST"):
        assert httpx.get(f"{guarded.url}/health", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
        refused = httpx.post(
            f"{guarded.url}/translate", json=TRANSLATE, headers={"Host": host, "Authorization": "Bearer key-one"}
        )
        assert refused.status_code == 400, host
        assert refused.json()["error"] == (
            f"Host: {host!r} is not a name this server answers to (allowed_hosts: localhost, 127.0.0.1, ::1); "
            "use one of them, or set allowed_hosts"
        )
        assert refused.headers["x-frame-options"] == "DENY"


def test_cors_for_the_listed_origin_only(guarded):
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    allowed = httpx.options(f"{guarded.url}/translate", headers={"Origin": "https://app.example", **preflight})
    assert allowed.status_code == 204
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    assert "POST" in allowed.headers["access-control-allow-methods"]
    assert "Authorization" in allowed.headers["access-control-allow-headers"]
    other = httpx.options(f"{guarded.url}/translate", headers={"Origin": "https://evil.example", **preflight})
    assert (other.status_code, other.json()) == (
        403,
        {"error": "Origin: 'https://evil.example' is not in cors_origins"},
    )

    answer = httpx.post(
        f"{guarded.url}/translate", json={**LIBRE, "api_key": "key-two"}, headers={"Origin": "https://app.example"}
    )
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "https://app.example"
    refused = httpx.post(f"{guarded.url}/translate", json=LIBRE, headers={"Origin": "https://app.example"})
    assert refused.status_code == 403 and refused.headers["access-control-allow-origin"] == "https://app.example"
    foreign = httpx.get(f"{guarded.url}/languages", headers={"Origin": "https://evil.example"})
    assert foreign.status_code == 200 and "access-control-allow-origin" not in foreign.headers
    assert "access-control-allow-origin" not in httpx.get(f"{guarded.url}/languages").headers  # no Origin


# ------------------------------------------------------------------ numbers that are no numbers
@pytest.mark.parametrize("number", ["Infinity", "-Infinity", "NaN", "1e400"])
def test_a_number_that_is_no_number_is_422_naming_the_field(guarded, number):
    """Before: LibreTranslate's alternatives Infinity or 1e400 was a 500 (OverflowError)."""
    shown = {"1e400": "Infinity"}.get(number, number)
    body = f'{{"q": "Ein Hund.", "source": "de", "target": "en", "alternatives": {number}, "api_key": "key-one"}}'
    answer = httpx.post(f"{guarded.url}/translate", content=body, headers={"Content-Type": "application/json"})
    assert (answer.status_code, answer.json()) == (
        422,
        {"error": f"alternatives: {shown} is not a whole number; give 0..3"},
    )
    for field in ("beam", "nbest"):
        mine = httpx.post(
            f"{guarded.url}/translate",
            content=f'{{"text": ["Ein Hund."], "{field}": {number}}}',
            headers={"Content-Type": "application/json", "Authorization": "Bearer key-one"},
        )
        assert (mine.status_code, mine.json()) == (422, {"error": f"{field}: must be a whole number, not a number"})


def test_a_whole_number_out_of_range_is_refused_naming_the_field(guarded):
    huge = 10**30
    mine = guarded.post({"text": ["Ein Hund."], "beam": huge}, headers={"Authorization": "Bearer key-one"})
    assert (mine.status_code, mine.json()) == (422, {"error": f"beam: {huge} is outside 1..4 (max_beam=4)"})
    libre = httpx.post(f"{guarded.url}/translate", json={**LIBRE, "alternatives": huge, "api_key": "key-one"})
    assert libre.status_code == 400  # LibreTranslate's own limit answer, as LibreTranslate gives it
    assert libre.json()["error"] == "Invalid request: alternatives parameter must be <= 3 (max_beam=4)"


# ------------------------------------------------------------------ guessing keys (last: it blocks 127.0.0.1)
def test_wrong_keys_are_slowed_and_then_refused_whatever_the_key(guarded):
    """Before: five wrong keys were five 403s at 0 ms, without end."""

    def wrong(number: int) -> httpx.Response:
        return guarded.post(TRANSLATE, headers={"Authorization": f"Bearer guess-{number}"})

    with ThreadPoolExecutor(FAILED_KEYS_PER_MINUTE) as pool:
        answers = list(pool.map(wrong, range(FAILED_KEYS_PER_MINUTE)))
    assert [answer.json() for answer in answers] == [{"error": "api_key: invalid API key"}] * FAILED_KEYS_PER_MINUTE
    assert all(answer.status_code == 403 for answer in answers)
    assert min(answer.elapsed.total_seconds() for answer in answers) >= FAILED_KEY_DELAY_S
    start = time.monotonic()
    for key in ("guess-next", "key-one"):  # the right key too: a 200 would tell a guess was right
        refused = guarded.post(TRANSLATE, headers={"Authorization": f"Bearer {key}"})
        assert refused.status_code == 429
        assert refused.json()["error"].startswith(
            f"api_key: over {FAILED_KEYS_PER_MINUTE} wrong API keys a minute from this address; retry in "
        )
        assert 1 <= int(refused.headers["Retry-After"]) <= 60 // FAILED_KEYS_PER_MINUTE
    assert time.monotonic() - start < 2  # refused at once, not after the delay
    assert httpx.get(f"{guarded.url}/health").status_code == 200  # what needs no key stays open


# ------------------------------------------------------------------ the settings
def test_the_host_allow_list_is_on_for_loopback_only_unless_set():
    assert host_patterns(ServeConfig()) == ["localhost", "127.0.0.1", "::1"]
    for host in ("localhost", "::1", "127.0.0.2"):
        assert host_patterns(ServeConfig(host=host)) is not None
    assert host_patterns(ServeConfig(host="0.0.0.0")) is None
    assert host_patterns(ServeConfig(host="0.0.0.0", allowed_hosts=["MT.example.org", "[::1]"])) == [
        "mt.example.org",
        "::1",
    ]
    assert host_patterns(ServeConfig(allowed_hosts=["*"])) is None


def test_wrong_settings_are_one_line_before_the_model_loads(run_dir, tmp_path):
    result = run_mtrain("serve", f"run={run_dir}", "port=0", "trusted_proxies=[localhost]", env=ENV, cwd=tmp_path)
    assert (result.returncode, result.stderr.decode()) == (
        2,
        "mtrain: error: trusted_proxies: 'localhost' is not an IP address or network (such as 127.0.0.1 or "
        "10.0.0.0/8)\n",
    )
    for setting, line in (
        (dict(allowed_hosts=[]), "allowed_hosts: [] allows no host;"),
        (dict(allowed_hosts=["example.org:8080"]), "allowed_hosts: 'example.org:8080' is not a host name;"),
        (dict(cors_origins=["app.example"]), "cors_origins: 'app.example' is not a web origin;"),
        (dict(cors_origins=["https://app.example/"]), "cors_origins: 'https://app.example/' is not a web origin;"),
    ):
        with pytest.raises(MtrainError) as refused:
            check_browser_rules(ServeConfig(**setting))
        assert str(refused.value).startswith(line)


def test_terms_as_annotation_of_a_model_that_reads_none_is_refused_at_start(run_dir, tmp_path):
    """Issue 58: the server started, then refused every request with terms."""
    result = run_mtrain("serve", f"run={run_dir}", "port=0", "decode.term_mode=annotation", env=ENV, cwd=tmp_path)
    assert (result.returncode, result.stderr.decode().splitlines()[-1]) == (
        2,
        "mtrain: error: decode.term_mode=annotation: this model reads no terms in its source (it was not trained "
        "with model.term_factors=true, train.term_alignment=...); use term_mode=constraints or auto",
    )


# ------------------------------------------------------------------ the middleware, in process
def call(middleware, headers: list[tuple[bytes, bytes]], peer: str = "127.0.0.1") -> tuple[int, str]:
    """One GET through `middleware` (an ASGI app around a 200 one): the status, and the client
    address the inner app saw ("" when it was not reached)."""
    seen = {"client": ("", 0)}

    async def app(scope, receive, send):
        seen["client"] = scope["client"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    scope = {"type": "http", "method": "GET", "path": "/health", "headers": headers, "client": (peer, 5000)}
    asyncio.run(middleware(app)(scope, receive, send))
    return sent[0]["status"], seen["client"][0]


def test_a_host_with_userinfo_or_junk_is_400_whatever_the_wildcard():
    """Before: `evil.com@mt.example.org` ended in `.example.org` and passed `*.example.org`."""
    check = functools.partial(HostCheck, patterns=["*.example.org", "mt.example.org"])
    for host in ("mt.example.org", "api.example.org:443", "MT.Example.ORG.", "a.b.example.org:"):
        assert call(check, [(b"host", host.encode())])[0] == 200, host
    for host in (
        "evil.com@mt.example.org",
        "evil.com@api.example.org:443",
        "user:pass@mt.example.org",
        "evil.com/.example.org",
        "evil.com .example.org",
        "evil.com?.example.org",
        "evil.com#.example.org",
        "..example.org",
        "api.example.org:80:80",
        "api.example.org:http",
        "[::1]evil.example.org",
    ):
        assert call(check, [(b"host", host.encode())]) == (400, ""), host
    loopback = functools.partial(HostCheck, patterns=["localhost", "127.0.0.1", "::1"])
    for host in ("[::1]:8080", "::1", "127.0.0.1:8080", "localhost."):
        assert call(loopback, [(b"host", host.encode())])[0] == 200, host
    for host in ("[::1", "[127.0.0.1]", "[::1]:80x", "localhost@127.0.0.1"):
        assert call(loopback, [(b"host", host.encode())]) == (400, ""), host


def test_only_the_last_hops_of_a_long_x_forwarded_for_are_read(monkeypatch):
    """Before: all 5,000 entries were split and each checked against the proxies, and a client
    could name itself behind any number of entries that looked like trusted proxies."""
    behind = functools.partial(ClientBehindProxies, networks=proxies(["127.0.0.1", "10.1.0.0/16"]))
    checked = []
    trusted = ClientBehindProxies.trusted
    monkeypatch.setattr(
        ClientBehindProxies, "trusted", lambda self, address: checked.append(address) or trusted(self, address)
    )
    long_header = ", ".join(["6.6.6.6"] * 4_999 + ["203.0.113.7"])
    assert call(behind, [(b"x-forwarded-for", long_header.encode())]) == (200, "203.0.113.7")
    assert len(checked) <= FORWARDED_HOPS + 1  # the peer, then at most the last hops
    # A chain longer than FORWARDED_HOPS of what look like our proxies: the client is not believed.
    spoofed = ", ".join(["6.6.6.6"] + ["10.1.0.1"] * (FORWARDED_HOPS + 4))
    assert call(behind, [(b"x-forwarded-for", spoofed.encode())]) == (200, "127.0.0.1")
    # Two headers are one list, in order; an untrusted peer's header is never read.
    assert call(behind, [(b"x-forwarded-for", b"6.6.6.6"), (b"x-forwarded-for", b"198.51.100.2, 10.1.0.9")]) == (
        200,
        "198.51.100.2",
    )
    assert call(behind, [(b"x-forwarded-for", b"198.51.100.2")], peer="192.0.2.1") == (200, "192.0.2.1")
