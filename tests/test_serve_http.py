"""mtrain.serve.protocol: what a slow, greedy or oversending client gets, through the server stack
`mtrain serve` runs (uvicorn with mtrain's protocol and middleware; `InProcessServer`, a stand-in
model) on a free loopback port, spoken to with raw sockets and Python's own HTTP clients."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from mtrain.config import DecodeConfig
from mtrain.serve.protocol import DISCARD_LIMIT_BYTES, NowAndThen, printable
from tests.servers import InProcessServer, StandIn, upper_case

BIG = json.dumps({"text": ["Ein Hund."] * 800_000}).encode()  # 10 MB, as in issue 40
TOO_LARGE = {"error": "max_request_bytes: the body is over the limit of 4096 bytes"}


def connect(server: InProcessServer, sending: bytes = b"") -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    connection.sendall(sending)
    return connection


def read_to_end(connection: socket.socket) -> bytes:
    """All the server sends until it closes the connection."""
    received = b""
    while chunk := connection.recv(65536):
        received += chunk
    return received


def answer_of(raw: bytes) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of one raw HTTP answer."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("ascii").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), headers, json.loads(body)


# ------------------------------------------------------------------ slow clients
def test_a_request_head_or_body_that_stalls_gets_a_408_and_the_connection_closes():
    with InProcessServer(StandIn(upper_case), read_timeout_s=0.5) as server:
        started = time.monotonic()
        half_head = connect(server, b"POST /translate HTTP/1.1\r\nHost: x\r\n")
        half_body = connect(server, b'POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"text"')
        silent = connect(server)
        for connection, (status, message) in (
            (half_head, (408, "read_timeout_s: the request's head did not arrive within 0.5 s")),
            (half_body, (408, "read_timeout_s: the request's body did not arrive within 0.5 s")),
        ):
            code, headers, body = answer_of(read_to_end(connection))
            assert (code, headers["connection"], body) == (status, "close", {"error": message})
        assert read_to_end(silent) == b""  # a connection that never sends is closed too
        assert time.monotonic() - started < 5
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200


def test_300_stalled_connections_are_all_closed_within_the_read_timeout():
    """Issue 40: 300 connections with half-sent requests stayed open for 40 s."""
    # read_timeout_s: time enough to open all 300 before the first ones time out, on a busy machine
    with InProcessServer(StandIn(upper_case), read_timeout_s=1.5, max_connections=100) as server:
        started = time.monotonic()
        stalled = [
            connect(server, b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{" if n % 2 else b"PO")
            for n in range(300)
        ]
        answers = [read_to_end(connection) for connection in stalled]
        closed_after = time.monotonic() - started
        for connection in stalled:
            connection.close()
        statuses = [answer_of(answer)[0] if answer else None for answer in answers]
        assert closed_after < 6, closed_after
        assert statuses.count(503) >= 150  # over max_connections: answered at once
        assert set(statuses) <= {503, 408, None}  # the rest: a 408, or closed (nothing sent yet)
        assert served_again(server)


def test_a_connection_over_max_connections_is_answered_503_at_once_and_served_once_others_close():
    with InProcessServer(StandIn(upper_case), max_connections=3) as server:
        held = [connect(server) for _ in range(3)]
        time.sleep(0.2)  # the server has taken them
        started = time.monotonic()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{server.url}/health", timeout=10)
        assert time.monotonic() - started < 2
        assert refused.value.code == 503
        assert json.loads(refused.value.read()) == {
            "error": "max_connections: 3 connections are open, the limit; retry later"
        }
        for connection in held:
            connection.close()
        assert served_again(server)


def served_again(server: InProcessServer) -> bool:
    """Whether /health answers 200 within 10 s (once the server has seen connections close)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if httpx.get(f"{server.url}/health", timeout=10).status_code == 200:
            return True
        time.sleep(0.05)
    return False


# ------------------------------------------------------------------ bodies over max_request_bytes
def test_every_common_client_reads_the_413_of_a_body_over_the_limit():
    """Issue 40: urllib (Content-Length) and http.client (chunked) got ConnectionResetError."""
    with InProcessServer(StandIn(upper_case), max_request_bytes=4096) as server:
        request = urllib.request.Request(
            f"{server.url}/translate", data=BIG, headers={"Content-Type": "application/json"}
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30)
        assert (refused.value.code, json.loads(refused.value.read())) == (413, TOO_LARGE)

        chunked = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        pieces = (BIG[start : start + 65536] for start in range(0, len(BIG), 65536))
        chunked.request("POST", "/translate", body=pieces, headers={"Content-Type": "application/json"})
        response = chunked.getresponse()
        assert (response.status, json.loads(response.read())) == (413, TOO_LARGE)
        chunked.request("GET", "/health")  # the body was read to its end: the connection goes on
        assert chunked.getresponse().status == 200
        chunked.close()

        response = httpx.post(f"{server.url}/translate", content=BIG, timeout=30)
        assert (response.status_code, response.json()) == (413, TOO_LARGE)


def test_a_client_that_asks_first_is_answered_before_it_sends_the_body():
    with InProcessServer(StandIn(upper_case), max_request_bytes=4096) as server:
        for declared in (len(BIG), 100 * 2**30):  # Expect: 100-continue (curl's way), and 100 GB without it
            expect = b"Expect: 100-continue\r\n" if declared == len(BIG) else b""
            head = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s\r\n" % (declared, expect)
            status, headers, body = answer_of(read_to_end(connect(server, head)))
            assert (status, headers["connection"], body) == (413, "close", TOO_LARGE)
        assert declared > DISCARD_LIMIT_BYTES  # too much to read through: answered at once


# ------------------------------------------------------------------ the request log
def test_each_request_is_one_log_line(caplog):
    caplog.set_level(logging.INFO, logger="mtrain.serve")
    with InProcessServer(StandIn(upper_case), max_request_bytes=4096) as server:
        httpx.post(f"{server.url}/translate", json={"text": ["a", "b"]}, timeout=10)
        httpx.post(f"{server.url}/translate", json={"text": ["a"], "beam": "x"}, timeout=10)
        httpx.get(f"{server.url}/health", timeout=10)
        httpx.post(f"{server.url}/translate", content=BIG[:10_000], timeout=10)
        httpx.get(f"{server.url}/nowhere%0Afake%20line", timeout=10)
    lines = [record.getMessage() for record in caplog.records if record.name == "mtrain.serve"]
    requests = [line.rsplit(",", 1)[0] for line in lines if line.endswith(" ms")]
    assert requests == [
        "POST /translate 200, 2 sentences",
        "POST /translate 422",
        "GET /health 200",
        "POST /translate 413",
        "GET /nowhere\\nfake line 404",  # a client's text is escaped: one request, one line
    ]

    with InProcessServer(StandIn(upper_case), access_log=False) as quiet:
        caplog.clear()
        httpx.get(f"{quiet.url}/health", timeout=10)
    assert not [record for record in caplog.records if record.getMessage().startswith("GET /health")]


def test_printable_and_now_and_then(caplog):
    assert printable("a\nb\ud800c") == "a\\nb\\ud800c"
    assert printable("x" * 100, limit=10) == "xxxxxxx..."
    caplog.set_level(logging.WARNING, logger="mtrain.serve")
    warnings = NowAndThen(interval_s=60)
    for _ in range(5):
        warnings.warn("a connection refused")
    warnings.last -= 60
    warnings.warn("a connection refused")
    assert [record.getMessage() for record in caplog.records] == [
        "a connection refused",
        "a connection refused (and 4 more like it since the last such line)",
    ]


# ------------------------------------------------------------------ what one request may cost
LONG_MODEL = dict(encoder_layers=1, decoder_layers=1, d_model=32, heads=4, ffn_dim=64, dropout=0.0, max_positions=1024)
# Words of Multi30k: a long sentence of them, and terms whose source words it holds.
WORDS = [
    "Ein",
    "Mann",
    "mit",
    "einem",
    "roten",
    "Hut",
    "spielt",
    "Gitarre",
    "auf",
    "der",
    "Straße",
    "während",
    "Kinder",
    "im",
    "Park",
    "zusehen",
]


@pytest.fixture(scope="module")
def long_model(tmp_path_factory, multi30k_spm_tokenizer):
    """A served untrained model with 1,024 positions: every hypothesis runs to its length limit
    (1.5 x the source + 10 tokens), so a long constrained sentence is a long search."""
    import torch
    from omegaconf import OmegaConf

    from mtrain.checkpoint.files import save_checkpoint
    from mtrain.config import FitConfig, ModelConfig, ServeConfig, to_plain
    from mtrain.model import build_model
    from mtrain.serve.model import open_served_model

    tokenizer = multi30k_spm_tokenizer
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(**LONG_MODEL),
        tokenizer.src_vocab_size,
        tokenizer.tgt_vocab_size,
        tokenizer.pad_id,
        joint_vocab=True,
    ).eval()
    run = tmp_path_factory.mktemp("long_run")
    tokenizer.save(run / "tokenizer")
    config = to_plain(OmegaConf.structured(FitConfig(model=ModelConfig(**LONG_MODEL))))
    save_checkpoint(run / "checkpoints" / "best.pt", {"model": model.state_dict(), "config": config, "update": 1})
    cfg = ServeConfig(run=str(run), device="cpu", precision="fp32", num_threads=1)
    return open_served_model(cfg, torch.device("cpu"), threads=1)


def timed_post(server: InProcessServer, body: dict) -> tuple[int, dict, float]:
    started = time.monotonic()
    response = httpx.post(f"{server.url}/translate", json=body, timeout=120)
    return response.status_code, response.json(), time.monotonic() - started


def test_a_request_over_the_constrained_search_limits_is_refused_at_once(long_model):
    """Issue 58: 4 sentences of 300 words with 256 matching terms held the server for 125 s."""
    sentences = [" ".join(WORDS * 20)] * 4  # 300 words each
    terms = [[word, f"term{n}"] for n, word in enumerate(dict.fromkeys(WORDS))]
    with InProcessServer(long_model, max_sentence_constraints=8) as server:
        status, body, took = timed_post(server, {"text": sentences, "terms": terms})
        assert (status, body) == (
            413,
            {
                "error": f"max_sentence_constraints: text[0] has {len(terms)} constraints (its terms found included), "
                "the limit is 8; send fewer terms or constraints, or split the sentence"
            },
        )
        status, body, took = timed_post(server, {"text": sentences, "terms": terms[:8]})
        assert status == 413 and body["error"].startswith(
            "max_constrained_work: the request's constrained sentences have "
        ), body
        assert body["error"].endswith(
            "source tokens x constraints, the limit is 16384; send fewer or shorter sentences with terms or constraints"
        )
        assert took < 5  # refused before any decoding
        status, body, _ = timed_post(server, {"text": [" ".join(WORDS)], "terms": terms[:8], "beam": 1})
        assert status == 200 and len(body["translations"]) == 1  # within the limits


def test_a_request_past_its_deadline_stops_decoding_and_others_are_served_meanwhile(long_model):
    """Issue 58: other clients got 504 while one constrained search ran, and its decode went on
    after its own 504."""
    innocent = {"text": ["Ein Hund."], "beam": 1}
    small_constrained = {"text": ["Ein Hund."], "terms": [["Hund", "dog"]], "beam": 1}
    # 4 sentences of 432 pieces, 4 terms each, beam 4: a 7 s search without a deadline (2 busy cores).
    heavy = {
        "text": [" ".join(WORDS * 12)] * 4,
        "terms": [[word, f"t{n}"] for n, word in enumerate(WORDS[:4])],
        "beam": 4,
    }
    with InProcessServer(long_model, request_timeout_s=1.5, max_constrained_work=10**6) as server:
        alone = min(timed_post(server, innocent)[2] for _ in range(3))
        constrained_alone = min(timed_post(server, small_constrained)[2] for _ in range(3))
        with ThreadPoolExecutor(1) as pool:
            heavy_answer = pool.submit(timed_post, server, heavy)
            time.sleep(0.3)  # it is decoding
            status, _, during = timed_post(server, innocent)
            assert status == 200 and during < max(1.0, 5 * alone), (during, alone)  # not queued behind it
            status, body, took = heavy_answer.result()
        assert status == 504 and body["error"].startswith("request_timeout_s: not translated within 1.5 s")
        assert took < 4
        # Its decode stopped: a constrained request (its lane) is answered in its normal time.
        status, _, after = timed_post(server, small_constrained)
        assert status == 200 and after < max(1.0, 5 * constrained_alone), (after, constrained_alone)


def test_markup_on_a_one_layer_decoder_is_refused_before_decoding_with_what_to_set(long_model):
    """Issue 58: format=html answered about `attention_layer: -2` after seconds of decoding."""
    long = " ".join(WORDS * 12)
    refusal = (
        "word alignments read decoder layer -2 (decode.alignment_layer=null: the penultimate), and this model's "
        "decoder has 1 layer; start the server with decode.alignment_layer=-1 (its last layer) to align, or send "
        "format=text without alignment"
    )
    with InProcessServer(long_model) as server:
        for body, field in (
            ({"text": [f"<b>{long}</b>"] * 4, "format": "html"}, "format=html"),
            ({"text": [long], "alignment": True}, "alignment"),
        ):
            status, answer, took = timed_post(server, body)
            assert (status, answer) == (422, {"error": f"{field}: {refusal}"})
            assert took < 2  # before any decoding
        libre = httpx.post(
            f"{server.url}/translate", json={"q": "<b>Hund</b>", "source": "de", "target": "en", "format": "html"}
        )
        assert (libre.status_code, libre.json()) == (422, {"error": f"format=html: {refusal}"})
    with InProcessServer(long_model, decode=DecodeConfig(alignment_layer=-1)) as server:
        status, answer, _ = timed_post(server, {"text": ["<b>Hund</b>"], "format": "html", "beam": 1})
        assert status == 200 and "<b>" in answer["translations"][0]
