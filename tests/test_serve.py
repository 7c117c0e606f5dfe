"""`mtrain serve`: the real server in a subprocess on a free loopback port, spoken to with httpx;
the whole server stack in a thread of this process (`InProcessServer`: uvicorn with mtrain's
protocol and middleware) for what needs many requests: the property test with random Unicode
and the API fuzz run from the OpenAPI schema (schemathesis); the app's error paths with a
stand-in model."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mtrain.config import DecodeConfig, MbrConfig, ServeConfig
from mtrain.decode.translation.translator import translate_sentences
from mtrain.errors import MtrainError
from tests.servers import DECODE, ENV, SENTENCES, InProcessServer, Server, StandIn, upper_case
from tests.warm_process import run_mtrain

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models
LIMITS = ["max_sentences=8", "max_sentence_chars=200", "max_request_bytes=4096", "max_beam=4"]


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    started = Server(f"run={run_dir}", *DECODE, *LIMITS, "max_wait_ms=50", cwd=tmp_path_factory.mktemp("serve_cwd"))
    yield started
    assert started.stop() == 0, started.stderr()
    assert "Traceback" not in started.stderr()


def expected(model, tokenizer, sentences, **decode):
    cfg = DecodeConfig(**{"beam": 2, "max_len_a": 0.5, "max_len_b": 3, **decode})
    return translate_sentences(model, tokenizer, sentences, cfg, "cpu")


# ------------------------------------------------------------------ what it answers
def test_health_describes_the_model_and_the_limits(server, run_dir):
    health = server.health()
    assert health["status"] == "ok" and health["model"] == f"{run_dir.name} (update 7)"
    answer = httpx.get(f"{server.url}/health", timeout=10).text
    assert str(run_dir.parent) not in answer and "best.pt" not in answer  # no path reaches a client
    assert (health["engine"], health["device"], health["precision"]) == ("torch", "cpu", "fp32")
    assert (health["src_lang"], health["tgt_lang"]) == ("de", "en")
    assert health["decode"] == {"beam": 2, "nbest": 1}
    assert health["limits"]["max_sentences"] == 8 and health["limits"]["max_beam"] == 4
    assert isinstance(health["batches"], int) and isinstance(health["requests"], int)


def test_translations_equal_mtrain_translate_s(server, run_dir, tmp_path):
    source = tmp_path / "in.de"
    source.write_text("".join(f"{s}\n" for s in SENTENCES), encoding="utf-8")
    result = run_mtrain("translate", f"run={run_dir}", f"input={source}", *DECODE, env=ENV, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    from_translate = result.stdout.decode().splitlines()

    response = server.post({"text": SENTENCES + [""], "tgt_lang": "en"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["translations"] == from_translate + [""]  # in input order; a blank sentence stays blank
    assert len(body["scores"]) == len(SENTENCES) + 1 and body["scores"][-1] == 0.0
    assert "nbest" not in body
    one_by_one = [server.post({"text": [sentence]}).json()["translations"][0] for sentence in SENTENCES]
    assert one_by_one == from_translate


def test_beam_and_nbest_per_request(server, model, tokenizer):
    response = server.post({"text": SENTENCES[:3], "beam": 3, "nbest": 3})
    assert response.status_code == 200, response.text
    body = response.json()
    for sentence_hyps, served, best, score in zip(
        expected(model, tokenizer, SENTENCES[:3], beam=3, nbest=3),
        body["nbest"],
        body["translations"],
        body["scores"],
        strict=True,
    ):
        assert [entry["text"] for entry in served] == [hyp.text for hyp in sentence_hyps]
        assert [entry["score"] for entry in served] == pytest.approx([hyp.score for hyp in sentence_hyps], abs=1e-5)
        assert (best, score) == (served[0]["text"], served[0]["score"])
    greedy = server.post({"text": SENTENCES[:2], "beam": 1}).json()["translations"]
    assert greedy == [hyps[0].text for hyps in expected(model, tokenizer, SENTENCES[:2], beam=1)]


def test_prefixes_constraints_and_avoided_phrases_per_request(server, model, tokenizer):
    plain = expected(model, tokenizer, SENTENCES[:3], beam=3, nbest=3)
    # A word the model wrote that is one piece on its own (as an avoided phrase is tokenized).
    banned = next(
        w for hyps in plain for h in hyps for w in h.text.split() if w.isalpha() and len(tokenizer.encode_tgt(w)) == 1
    )
    body = {
        "text": SENTENCES[:3],
        "beam": 3,
        "nbest": 3,
        "prefix": ["Two young", None, ""],
        "constraints": [["building"], [], ["guitar", "street"]],
        "avoid": [banned],
    }
    response = server.post(body)
    assert response.status_code == 200, response.text
    # The best of each: this random model's other hypotheses run into the server's short length limit.
    first, _, third = response.json()["translations"]
    assert first.startswith("Two young") and "building" in first
    assert "guitar" in third and "street" in third
    assert all(banned not in entry["text"].split() for hyps in response.json()["nbest"] for entry in hyps)
    alone = server.post({"text": SENTENCES[1:2], "beam": 3, "prefix": ["Two"]}).json()["translations"][0]
    assert alone.startswith("Two")
    # A request without them decodes as before, though it may share a batch with one that has them.
    assert server.post({"text": SENTENCES[:3], "beam": 3}).json()["translations"] == [h[0].text for h in plain]


def served_check(body, cfg: ServeConfig, engine: str = "torch"):
    """The request pipeline's requests for `body` on a server of `cfg` and `engine`, checked
    by the rules (mtrain.decoding_rules) as the server checks them."""
    from mtrain.decode.requests.pipeline import PipelineStats
    from mtrain.serve.app import pipeline_request
    from mtrain.serve.translation import Served

    model = StandIn(upper_case)
    model.engine_name = engine
    served = Served(model, cfg, None, PipelineStats())
    requests, options = pipeline_request(body, served)
    return served.check(requests, options).requests


def test_constraints_are_refused_where_the_server_cannot_honour_them():
    from mtrain.decoding_rules import RefusedCombination
    from mtrain.serve.app import TranslateRequest

    request = TranslateRequest(text=["Ein Hund."], constraints=[["dog"]])
    with pytest.raises(
        RefusedCombination, match="constraints: CTranslate2 has no lexical constraints .*use engine=torch"
    ):
        served_check(request, ServeConfig(), "ctranslate2")
    sampling = ServeConfig(decode=DecodeConfig(sampling="topk"))
    with pytest.raises(RefusedCombination, match="need beam search"):
        served_check(request, sampling)
    prefix_only = TranslateRequest(text=["Ein Hund."], prefix=["A"], avoid=["cat"])
    assert served_check(prefix_only, ServeConfig(), "ctranslate2")[0].prefix == "A"
    mbr = ServeConfig(decode=DecodeConfig(mbr=MbrConfig(candidates="beam", num_candidates=4)))
    with pytest.raises(RefusedCombination, match="prefix: MBR decoding and n-best reranking .* do not take prefixes"):
        served_check(prefix_only, mbr)
    with pytest.raises(RefusedCombination, match="alignment: MBR decoding .* keeps no attention"):
        served_check(TranslateRequest(text=["Ein Hund."], alignment=True), mbr)


def test_alignments_and_markup_per_request(server, model, tokenizer):
    from mtrain.decode.requests.markup import parse_markup, restore_markup, tags_of
    from mtrain.decode.translation.alignment import pharaoh

    response = server.post({"text": SENTENCES[:2], "alignment": True, "nbest": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    hyps = expected(model, tokenizer, SENTENCES[:2], nbest=2, alignment="word")
    assert body["alignments"] == [pharaoh(sentence_hyps[0].alignment) for sentence_hyps in hyps]
    assert [[entry["alignment"] for entry in served] for served in body["nbest"]] == [
        [pharaoh(hyp.alignment) for hyp in sentence_hyps] for sentence_hyps in hyps
    ]
    assert "alignments" not in server.post({"text": SENTENCES[:1]}).json()

    tagged = ["Ein <b>Hund</b> läuft.<br/>", "<x id='1'/>"]
    markup = [parse_markup(line, "xml") for line in tagged]
    body = server.post({"text": tagged, "format": "xml"}).json()
    plain = expected(model, tokenizer, [m.text for m in markup], alignment="word")
    assert body["translations"] == [
        restore_markup(m, hyps[0].text, hyps[0].alignment) for m, hyps in zip(markup, plain, strict=True)
    ]
    assert sorted(tags_of(parse_markup(body["translations"][0], "xml"))) == sorted(tags_of(markup[0]))
    bad = server.post({"text": ["fine", "<b>open"], "format": "html"})
    assert bad.status_code == 422 and bad.json()["error"] == "text[1]: format=html: element <b> is never closed"
    assert server.post({"text": ["x"], "format": "md"}).status_code == 422


def test_concurrent_requests_are_decoded_in_fewer_batches(server, model, tokenizer):
    before = server.health()
    answers: dict[int, httpx.Response] = {}
    start = threading.Barrier(16)

    def client(number: int) -> None:
        start.wait()
        answers[number] = server.post({"text": [SENTENCES[number % len(SENTENCES)]]})

    threads = [threading.Thread(target=client, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    after = server.health()
    best = [hyps[0].text for hyps in expected(model, tokenizer, SENTENCES)]
    assert all(answers[n].status_code == 200 for n in range(16))
    assert [answers[n].json()["translations"] for n in range(16)] == [[best[n % len(SENTENCES)]] for n in range(16)]
    assert after["requests"] - before["requests"] == 16
    assert after["sentences"] - before["sentences"] == 16
    assert after["batches"] - before["batches"] < 16, (before, after)
    assert after["largest_batch"] > 1


def test_a_json_body_is_read_whatever_its_content_type_says(server):
    for headers in ({}, {"Content-Type": "text/plain"}, {"Content-Type": "application/x-www-form-urlencoded"}):
        response = httpx.post(f"{server.url}/translate", content=b'{"text": ["Ein Hund."]}', headers=headers)
        assert response.status_code == 200 and len(response.json()["translations"]) == 1, (headers, response.text)


# ------------------------------------------------------------------ one client cannot break another's request
def at_once(send, bodies: list) -> list[httpx.Response]:
    """`send(body)` for every body, each from its own thread, all let go together; answers in order."""
    start = threading.Barrier(len(bodies))

    def send_when_all_are_ready(body) -> httpx.Response:
        start.wait()
        return send(body)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(send_when_all_are_ready, bodies))


def test_a_lone_surrogate_fails_its_own_request_only(server, model, tokenizer):
    """Issue 40: {"text": ["\\ud800"]} was a 500, and so were the requests decoded in its batch
    (8 innocent concurrent requests: 8, 2 and 8 of them failed in three trials)."""
    best = [hyps[0].text for hyps in expected(model, tokenizer, SENTENCES)]
    bodies = [{"text": [SENTENCES[n % 6]]} for n in range(8)] + [{"text": ["\ud800"]}]
    for _trial in range(3):
        answers = at_once(server.post_raw, bodies)
        assert answers[8].status_code == 422, answers[8].text
        assert answers[8].json() == {
            "error": "text[0]: character 0 is a lone UTF-16 surrogate (\\ud800), not text; "
            "send valid Unicode (a surrogate pair, or UTF-8)"
        }
        assert [(answers[n].status_code, answers[n].json()["translations"]) for n in range(8)] == [
            (200, [best[n % 6]]) for n in range(8)
        ]


LONE = "\ud800"  # a lone UTF-16 surrogate: valid JSON ("\\ud800"), not Unicode text


@pytest.mark.parametrize(
    "fields, field, character",
    [
        (dict(terms=[["Hund", LONE]]), "terms[0][1]", 0),
        (dict(terms=[["Hund", "dog"], [f"Ha{LONE}", "cat"]]), "terms[1][0]", 2),
        (dict(avoid=["dog", f"a{LONE}"]), "avoid[1]", 1),
        (dict(constraints=[[LONE]]), "constraints[0][0]", 0),
        (dict(prefix=[f"A {LONE}"]), "prefix[0]", 2),
    ],
)
def test_a_lone_surrogate_in_a_phrase_is_the_client_s_error(server, fields, field, character):
    """Issue 58: one in terms, avoid or constraints was a 500."""
    response = server.post_raw({"text": ["Ein Hund."], **fields})
    assert (response.status_code, response.json()) == (
        422,
        {
            "error": f"{field}: character {character} is a lone UTF-16 surrogate (\\ud800), not text; "
            "send valid Unicode (a surrogate pair, or UTF-8)"
        },
    )


@pytest.mark.parametrize(
    "fields, error",
    [
        (
            dict(terms=[["Hund", "dog"], ["Hund", "cat"]]),
            "terms[1]: 'Hund' has the target 'cat' here and 'dog' in terms[0]; keep one",
        ),
        (
            dict(terms=[["Hund", "dog"]], avoid=["dog"]),
            "avoid[0]: 'dog' is in the target term of terms[0] ('dog'): a translation cannot both hold it and "
            "avoid it; drop one of them",
        ),
        (
            dict(constraints=[["a hot  dog"]], avoid=["man", "hot dog"]),
            "avoid[1]: 'hot dog' is in constraints[0][0] ('a hot  dog'): a translation cannot both hold it and "
            "avoid it; drop one of them",
        ),
    ],
)
def test_contradictory_terms_and_avoided_phrases_are_refused_as_a_terms_file_is(server, fields, error):
    """Issue 58: accepted silently, while a terms file with them is refused."""
    response = server.post({"text": ["Ein Hund."], **fields})
    assert (response.status_code, response.json()) == (400, {"error": error})
    # the same terms are not contradictory: one pair given twice, and an avoided word the term does not hold
    fine = server.post({"text": ["Ein Hund."], "terms": [["Hund", "dog"], ["Hund", "dog"]], "avoid": ["do"]})
    assert fine.status_code == 200, fine.text


def test_a_sentence_the_tokenizer_refuses_is_the_client_s_error(tokenizer):
    from mtrain.serve.model import ServedModel

    served = ServedModel(
        None, tokenizer, torch.device("cpu"), "fp32", "a checkpoint", "run", "torch", "de", "en", 64, 1
    )
    with pytest.raises(MtrainError, match=r"^text: a sentence the tokenizer cannot encode \(RuntimeError\)"):
        served.encode("Ein \ud800 Hund.")  # what the HTTP checks refuse first; had one slipped past them


def test_a_sentence_that_fails_to_encode_or_decode_fails_its_own_request_only():
    """The batch it shared is decoded again request by request: the innocent ones are answered."""

    calls: list[list[str]] = []

    def translate(sentences, cfg, tgt_lang=None):
        calls.append(list(sentences))
        if "refused" in sentences:
            raise MtrainError("text: a sentence the tokenizer cannot encode (RuntimeError); send valid Unicode text")
        if "a bug" in sentences:
            raise RuntimeError("a bug in decoding")
        return upper_case(sentences, cfg)

    with InProcessServer(StandIn(translate), max_wait_ms=300, access_log=False) as started, httpx.Client() as client:
        texts = [["refused"], ["a bug"]] + [[f"satz {n}", "noch einer"] for n in range(8)]
        answers = at_once(lambda text: client.post(f"{started.url}/translate", json={"text": text}, timeout=30), texts)
        assert (answers[0].status_code, answers[0].json()["error"]) == (
            422,
            "text: a sentence the tokenizer cannot encode (RuntimeError); send valid Unicode text",
        )
        assert (answers[1].status_code, answers[1].json()["error"]) == (
            500,
            "internal error (RuntimeError); the server's log has the details",
        )
        assert [(a.status_code, a.json()["translations"]) for a in answers[2:]] == [
            (200, [f"SATZ {n}", "NOCH EINER"]) for n in range(8)
        ]
    assert any(len(call) > 2 and "refused" in call for call in calls)  # it did share a batch with others


# Characters that have broken text services: lone surrogates (valid in JSON, not in Unicode),
# controls, bidirectional marks, a byte order mark, zero-width ones, emoji, Arabic.
ODD_CHARACTERS = "\ud800\udbff\udc00\udfff\x00\x07\x1b\x7f\u202e\u200f\u2066\ufeff\u200b\U0001f600\U0001f1e9\u0627\r\n"


def character() -> st.SearchStrategy[str]:
    return st.one_of(
        st.characters(),
        st.characters(categories=["Cs"]),  # lone surrogates
        st.characters(categories=["Cc", "Cf"]),  # controls and format characters (bidi marks)
        st.sampled_from(ODD_CHARACTERS),
    )


def sentence() -> st.SearchStrategy[str]:
    return st.one_of(
        st.text(character(), max_size=40),
        # up to 10,000 characters (max_sentence_chars below): a piece repeated
        st.builds(
            lambda piece, times: (piece * times)[:10_000],
            st.text(character(), min_size=1, max_size=8),
            st.integers(1, 10_000),
        ),
        st.sampled_from(SENTENCES),
    )


def is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@pytest.fixture(scope="module")
def model_server(run_dir):
    """The test model in an InProcessServer that takes sentences of up to 10,000 characters."""
    from mtrain.serve.model import open_served_model

    settings = dict(
        run=str(run_dir),
        device="cpu",
        precision="fp32",
        num_threads=1,
        decode=DecodeConfig(beam=2, max_len_a=0.5, max_len_b=3),
        max_beam=4,
        max_sentence_chars=10_000,
        max_wait_ms=20.0,
        access_log=False,
    )
    served = open_served_model(ServeConfig(**settings), torch.device("cpu"), 1)
    with InProcessServer(served, **settings) as started:
        yield started


def test_random_unicode_in_concurrent_requests_never_fails_a_neighbour(model_server, model, tokenizer):
    """No 500 for any text, a 422 naming the sentence for text that is not Unicode, and the
    requests decoded alongside are answered as if alone."""
    innocent = ["Ein Hund.", "Kinder spielen im Park."]
    innocent_best = [hyps[0].text for hyps in expected(model, tokenizer, innocent)]

    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(6) as pool:

        def post(text: list[str]) -> httpx.Response:
            body = json.dumps({"text": text}).encode()  # ASCII: a lone surrogate goes as "\\ud800"
            return client.post(
                f"{model_server.url}/translate", content=body, headers={"Content-Type": "application/json"}
            )

        @settings(
            max_examples=20,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
        )
        @given(st.lists(st.lists(sentence(), max_size=3), min_size=1, max_size=4))
        def concurrent_requests(texts: list[list[str]]) -> None:
            answers = list(pool.map(post, [innocent, *texts, innocent]))
            assert [answer.status_code for answer in answers if answer.status_code >= 500] == []
            for answer in (answers[0], answers[-1]):
                assert (answer.status_code, answer.json()["translations"]) == (200, innocent_best)
            for text, answer in zip(texts, answers[1:-1], strict=True):
                not_unicode = [index for index, sentence in enumerate(text) if not is_unicode(sentence)]
                if not_unicode:
                    assert answer.status_code == 422, answer.text
                    assert answer.json()["error"].startswith(f"text[{not_unicode[0]}]: character ")
                else:
                    assert answer.status_code == 200, answer.text
                    assert len(answer.json()["translations"]) == len(text)

        concurrent_requests()


def test_an_api_fuzz_run_from_the_openapi_schema_finds_no_server_error(model_server):
    """schemathesis makes requests from the server's own OpenAPI schema (mtrain's API and
    LibreTranslate's), valid ones and ones that break it (wrong types, missing and unknown
    fields); none may get a 5xx, and every answer says it may not be framed or sniffed."""
    schemathesis = pytest.importorskip(
        "schemathesis", reason="schemathesis is not installed (pip install 'mtrain[dev]')"
    )
    requests = pytest.importorskip("requests")

    schema = schemathesis.openapi.from_url(f"{model_server.url}/openapi.json")
    cases = st.one_of(
        schema.as_strategy(schemathesis.GenerationMode.POSITIVE),
        schema.as_strategy(schemathesis.GenerationMode.NEGATIVE),
    )
    statuses: set[tuple[str, int]] = set()
    with requests.Session() as session:

        @settings(
            max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(cases)
        def no_server_error(case) -> None:
            response = case.call(base_url=model_server.url, session=session, timeout=60)
            statuses.add((case.path, response.status_code))
            assert response.status_code < 500, case.as_curl_command()
            assert response.headers["content-type"] == ["application/json"]  # an answer of ours, JSON
            assert response.headers["x-frame-options"] == ["DENY"], case.as_curl_command()
            assert response.headers["x-content-type-options"] == ["nosniff"]
            assert response.headers["content-security-policy"] == ["frame-ancestors 'none'"]
            # an object, or GET /languages' list of languages (LibreTranslate's shape)
            assert isinstance(json.loads(response.content), list if case.path == "/languages" else dict)

        no_server_error()
    # it did reach the routes, with good and bad requests
    assert {("/translate", 200), ("/translate", 422), ("/libretranslate/translate", 200)} <= statuses, statuses
    assert {status for path, status in statuses if path == "/libretranslate/translate"} & {400, 422}, statuses


# ------------------------------------------------------------------ what it refuses
BAD_REQUESTS = [
    # (what is sent, status, the start of the error)
    (dict(content=b'{"text": ["Ein Hund."'), 400, "body: malformed JSON (Expecting"),
    (dict(content=b"not json at all"), 400, "body: malformed JSON"),
    (dict(content=b"not json at all", headers={}), 400, "body: malformed JSON"),  # no Content-Type
    (dict(content=b"text=Ein+Hund.", headers={"Content-Type": "application/x-www-form-urlencoded"}), 400, "body:"),
    (dict(content=b"", headers={}), 400, "body: malformed JSON (an empty body)"),
    (dict(content=b"[" * 4000), 400, "body: malformed JSON (nested too deeply)"),  # past the recursion limit
    (dict(content=b'{"text": ["\xff"]}'), 400, "body: malformed JSON ('utf-8' codec can't decode"),
    (dict(json={"text": SENTENCES + SENTENCES}), 413, "max_sentences: 12 sentences"),
    (dict(json={"text": ["Ein Hund. " * 30]}), 413, "max_sentence_chars: text[0] has 300 characters"),
    (dict(json={"text": "Ein Hund."}), 422, "text: must be a list of sentences (strings), not a string"),
    (dict(json={"text": ["Ein Hund.", 7]}), 422, "text[1]: must be a string (a sentence), not a number"),
    (dict(json={"text": ["Ein Hund."], "beam": "2"}), 422, "beam: must be a whole number, not a string"),
    (dict(json={"text": ["Ein Hund."], "beam": 2.5}), 422, "beam: must be a whole number, not a number"),
    (dict(json={"text": ["Ein Hund."], "beam": True}), 422, "beam: must be a whole number, not true"),
    (dict(json={"text": ["Ein Hund."], "tgt_lang": 3}), 422, "tgt_lang: must be a language (a string) or null"),
    (dict(json={"sentences": ["Ein Hund."]}), 422, "sentences: not a field of this request (the fields: text, "),
    (dict(json={"txt": ["Ein Hund."]}), 422, 'txt: not a field of this request; did you mean "text"?'),
    (dict(json={"text": ["Ein Hund."], "beem": 2}), 422, 'beem: not a field of this request; did you mean "beam"?'),
    (dict(json={}), 422, 'text: missing; send the sentences as "text": ['),
    (dict(json=["Ein Hund."]), 422, 'body: must be a JSON object such as {"text": ["..."]}, not a list'),
    (dict(content=b'{"text": ["Ein Hund.", "\\ud800"]}'), 422, "text[1]: character 0 is a lone UTF-16 surrogate"),
    (dict(content=b'{"text": ["a\\udfffb"]}'), 422, "text[0]: character 1 is a lone UTF-16 surrogate (\\udfff)"),
    (dict(content=b'{"\\ud800": 1}'), 422, "body: the field name \\ud800 is not Unicode text"),
    (
        dict(json={"text": ["Ein Hund."], "tgt_lang": "fr"}),
        422,
        "tgt_lang: 'fr' is not a language this model translates into (allowed: 'en' or null)",
    ),
    (dict(json={"text": ["Ein Hund."], "beam": 5}), 422, "beam: 5 is outside 1..4 (max_beam=4)"),
    (dict(json={"text": ["Ein Hund."], "beam": 0}), 422, "beam: 0 is outside 1..4"),
    (dict(json={"text": ["Ein Hund."], "beam": 2, "nbest": 3}), 422, "nbest: 3 is above beam=2"),
    (dict(json={"text": ["Ein Hund.", "a"], "prefix": ["A"]}), 422, "prefix: 1 entries for 2 sentences in text"),
    (dict(json={"text": ["Ein Hund."], "constraints": ["dog"]}), 422, "constraints[0]: must be a list"),
    (dict(json={"text": ["Ein Hund."], "avoid": "dog"}), 422, "avoid: must be a list of phrases (strings)"),
    (dict(json={"text": ["Ein Hund."], "avoid": ["x"] * 33}), 422, "avoid: 33 phrases, at most 32"),
]


@pytest.mark.parametrize(
    "request_options,status,error",
    BAD_REQUESTS,
    ids=[f"{status}-{error.split(':')[0]}-{i}" for i, (_, status, error) in enumerate(BAD_REQUESTS)],
)
def test_a_bad_request_is_a_json_error_naming_the_field_or_limit(server, request_options, status, error):
    if "content" in request_options and "headers" not in request_options:
        request_options = {**request_options, "headers": {"Content-Type": "application/json"}}
    response = httpx.post(f"{server.url}/translate", timeout=30, **request_options)
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    assert list(response.json()) == ["error"] and response.json()["error"].startswith(error), response.json()


def test_a_body_over_max_request_bytes_is_refused_before_it_is_parsed(server):
    big = json.dumps({"text": ["Ein Hund."] * 600}).encode()  # 7 KB: over the 4,096 bytes
    declared = httpx.post(f"{server.url}/translate", content=big, headers={"Content-Type": "application/json"})

    def chunks():  # no Content-Length: counted as it arrives
        for start in range(0, len(big), 1000):
            yield big[start : start + 1000]

    chunked = httpx.post(f"{server.url}/translate", content=chunks(), headers={"Content-Type": "application/json"})
    for response in (declared, chunked):
        assert response.status_code == 413, response.text
        assert response.json() == {"error": "max_request_bytes: the body is over the limit of 4096 bytes"}


def test_no_route_and_a_wrong_method_are_json_too(server):
    assert (lambda r: (r.status_code, r.json()))(httpx.get(f"{server.url}/nowhere")) == (404, {"error": "Not Found"})
    response = httpx.get(f"{server.url}/translate")
    assert (response.status_code, response.json()) == (405, {"error": "Method Not Allowed"})
    assert httpx.get(f"{server.url}/docs").status_code == 404  # no interactive docs pulling in scripts


# ------------------------------------------------------------------ engine=ctranslate2, and SIGTERM
@pytest.mark.slow
def test_an_export_directory_is_served_and_sigterm_finishes_the_request_in_flight(run_dir, tmp_path):
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'mtrain[ct2]')")
    from mtrain.decode.engines.ct2_engine import load_ctranslate2
    from mtrain.export import export_run

    export = export_run(run_dir, tmp_path / "ct2")
    ct2 = load_ctranslate2(export, torch.device("cpu"), "fp32", 1)
    best = [
        hyps[0].text
        for hyps in translate_sentences(
            ct2, ct2.tokenizer, SENTENCES, DecodeConfig(beam=2, max_len_a=0.5, max_len_b=3), "cpu"
        )
    ]
    # A batch of fewer than 6 sentences waits 2 s for company: time to send SIGTERM while one is queued.
    # No engine=: an export directory is CTranslate2's to decode.
    server = Server(f"run={export}", *DECODE, "max_batch_sentences=6", "max_wait_ms=2000", cwd=tmp_path)
    try:
        assert server.health()["engine"] == "ctranslate2" and server.health()["tgt_lang"] == "en"
        assert server.post({"text": SENTENCES, "tgt_lang": "en"}).json()["translations"] == best  # a full batch
        assert server.post({"text": ["Ein Hund."], "tgt_lang": "de"}).status_code == 422

        answer: dict[str, httpx.Response] = {}
        in_flight = threading.Thread(target=lambda: answer.update(response=server.post({"text": SENTENCES[:3]})))
        in_flight.start()
        deadline = time.monotonic() + 10
        while server.health()["queued_sentences"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(httpx.TransportError):  # no longer accepting
            httpx.get(f"{server.url}/health", timeout=2)
        in_flight.join(30)
        assert answer["response"].status_code == 200 and answer["response"].json()["translations"] == best[:3]
        assert server.process.wait(timeout=30) == 0, server.stderr()
        assert "Traceback" not in server.stderr()
    finally:
        server.stop()


# ------------------------------------------------------------------ the command's own checks
def test_the_config_composes_and_bad_values_are_one_line(run_dir, capsys):
    from hydra import compose, initialize_config_dir

    from mtrain.cli.common import CONFIG_DIR, check_before_run
    from mtrain.cli.serve import run_serve

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("serve")
    assert (cfg.host, cfg.port, cfg.decode.beam, cfg.ensemble, cfg.max_batch_sentences) == (
        "127.0.0.1",
        8080,
        5,
        [],
        64,
    )
    for argv, line in (
        (["max_beam=3"], "max_beam: 3 is below decode.beam=5"),
        (["port=70000"], "port: 70000 must be in 0..65535"),
        (["max_wait_ms=-1"], "max_wait_ms: -1.0 must be >= 0"),
        (["request_timeout_s=0"], "request_timeout_s: 0.0 must be > 0"),
        (["max_sentences=0"], "max_sentences: 0 must be >= 1"),
        (["read_timeout_s=0"], "read_timeout_s: 0.0 must be > 0"),
        (["max_connections=0"], "max_connections: 0 must be >= 1"),
        (["max_batch_size=3"], "max_batch_size: unknown config key"),
    ):
        with pytest.raises(SystemExit) as stop:
            check_before_run("serve", [f"run={run_dir}", *argv])
        assert stop.value.code == 2
        assert capsys.readouterr().err.startswith(f"mtrain: error: {line}")
    with pytest.raises(MtrainError, match="run=RUN_DIR is missing"):
        run_serve(ServeConfig())
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(MtrainError, match=f"port={port}: cannot listen on 127.0.0.1:{port}"):
            run_serve(ServeConfig(run=str(run_dir), port=port))
    with pytest.raises(MtrainError, match="host=no.such.host.invalid: not an address"):
        run_serve(ServeConfig(run=str(run_dir), host="no.such.host.invalid", port=0))


def test_the_open_file_limit_is_raised_to_fit_max_connections(monkeypatch):
    resource = pytest.importorskip("resource")
    from mtrain.cli.serve import allow_open_files

    raised: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (256, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda _which, limits: raised.append(limits))
    allow_open_files(512)
    assert raised == [(576, 4096)]  # the connections and 64 files besides
    with pytest.raises(MtrainError, match=r"^max_connections: 5000 connections need 5064 open files, but this"):
        allow_open_files(5000)


# ------------------------------------------------------------------ the app in-process
def app_client(translate, **limits):
    from starlette.testclient import TestClient

    from mtrain.serve.app import build_app

    return TestClient(
        build_app(StandIn(translate), ServeConfig(**limits)), raise_server_exceptions=False, base_url="http://localhost"
    )


def test_a_slow_translation_is_a_504_and_a_failing_one_a_500_without_traceback():
    from mtrain.decode.search.hypothesis import Hypothesis

    def slow(sentences, cfg, tgt_lang=None):
        time.sleep(1.0)
        return [[Hypothesis(tokens=[], score=0.0, text=s.upper())] for s in sentences]

    with app_client(slow, request_timeout_s=0.2) as client:
        response = client.post("/translate", json={"text": ["a"]})
        assert response.status_code == 504
        assert response.json()["error"].startswith("request_timeout_s: not translated within 0.2 s")

    def broken(sentences, cfg, tgt_lang=None):
        raise RuntimeError("a bug\nTraceback (most recent call last): ...")

    def refused(sentences, cfg, tgt_lang=None):
        raise MtrainError("model.max_positions: a source of 90 tokens exceeds the model's 64 positions")

    with app_client(broken) as client:
        response = client.post("/translate", json={"text": ["a"]})
        assert (response.status_code, response.json()) == (
            500,
            {"error": "internal error (RuntimeError); the server's log has the details"},
        )
    with app_client(refused) as client:
        response = client.post("/translate", json={"text": ["a"]})
        assert response.status_code == 422 and response.json()["error"].startswith("model.max_positions")


def test_request_settings_start_from_the_server_s_decode_section():
    from mtrain.config import Sampling
    from mtrain.serve.app import Rejected, TranslateRequest, request_decoding

    cfg = ServeConfig(decode=DecodeConfig(beam=4, nbest=2, length_penalty=0.6), max_beam=6)
    decode = request_decoding(TranslateRequest(text=["a"], beam=6), cfg)
    assert (decode.beam, decode.nbest, decode.length_penalty) == (6, 2, 0.6)
    assert request_decoding(TranslateRequest(text=["a"]), cfg) == cfg.decode
    with pytest.raises(Rejected, match="nbest: 5 is above beam=4"):
        request_decoding(TranslateRequest(text=["a"], nbest=5), cfg)
    sampling = ServeConfig(decode=DecodeConfig(beam=1, sampling=Sampling.topk, top_k=5), max_beam=6)
    assert request_decoding(TranslateRequest(text=["a"], nbest=4), sampling).nbest == 4  # 4 samples, no beam
