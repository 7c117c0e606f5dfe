"""LibreTranslate's API on `mtrain serve`, with API keys and a rate limit: LibreTranslate's own
client (libretranslatepy) against the real server in a subprocess; the rules in-process."""

from __future__ import annotations

import json
import urllib.error
from typing import ClassVar

import httpx
import pytest

from mtrain.config import DecodeConfig, ServeConfig
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.errors import MtrainError
from mtrain.serve.access import RateLimiter, read_api_keys
from tests.conftest import needed_in_ci
from tests.servers import DECODE, SENTENCES, Server

KEYS = "# who may translate\nkey-one\n\n  key-two  \nkey-three\n"
PER_MINUTE = 40


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("libretranslate")
    keys = cwd / "keys.txt"
    keys.write_text(KEYS, encoding="utf-8")
    started = Server(
        f"run={run_dir}",
        *DECODE,
        "max_sentences=8",
        "max_beam=4",
        f"api_keys_file={keys}",
        f"rate_limit_per_minute={PER_MINUTE}",
        cwd=cwd,
    )
    yield started
    assert started.stop() == 0, started.stderr()
    assert "Traceback" not in started.stderr()


def http_error(call) -> tuple[int, dict]:
    """The status and JSON body of the urllib error a libretranslatepy call raises."""
    with pytest.raises(urllib.error.HTTPError) as raised:
        call()
    return raised.value.code, json.loads(raised.value.read())


def test_libretranslatepy_translates_as_mtrain_s_own_api(server):
    client = needed_in_ci("libretranslatepy", "pip install libretranslatepy (the dev extra)")
    api = client.LibreTranslateAPI(server.url, api_key="key-one")
    assert api.languages() == [
        {"code": "de", "name": "German", "targets": ["en"]},
        {"code": "en", "name": "English", "targets": []},
    ]
    native = httpx.post(
        f"{server.url}/translate", json={"text": SENTENCES[:4]}, headers={"Authorization": "Bearer key-one"}
    )
    assert native.status_code == 200, native.text
    mine = native.json()["translations"]
    # One text of several lines: each line one sentence, joined again (a blank line stays blank).
    text = "\n".join([*SENTENCES[:2], "", *SENTENCES[2:4]])
    assert api.translate(text, "de", "en") == "\n".join([*mine[:2], "", *mine[2:4]])
    assert api.translate(SENTENCES[0], "auto", "en") == mine[0]

    assert http_error(lambda: api.translate("Ein Hund.", "de", "fr")) == (400, {"error": "fr is not supported"})
    assert http_error(lambda: api.translate("", "de", "en")) == (400, {"error": "Invalid request: missing q parameter"})
    status, body = http_error(lambda: client.LibreTranslateAPI(server.url).translate("Ein Hund.", "de", "en"))
    assert status == 403 and body["error"].startswith("api_key: this server requires an API key")
    status, body = http_error(lambda: client.LibreTranslateAPI(server.url, "key-nine").translate("Hund", "de", "en"))
    assert (status, body) == (403, {"error": "api_key: invalid API key"})

    # JSON, as LibreTranslate's web clients send it: q a list; 2 alternatives: the beam's 3 best.
    answer = httpx.post(
        f"{server.url}/translate",
        json={"q": SENTENCES[:2], "source": "de", "target": "en", "alternatives": 2, "api_key": "key-two"},
    )
    assert answer.status_code == 200, answer.text
    beam3 = httpx.post(
        f"{server.url}/translate",
        json={"text": SENTENCES[:2], "beam": 3, "nbest": 3},
        headers={"Authorization": "Bearer key-two"},
    )
    assert beam3.status_code == 200, beam3.text
    beam3 = beam3.json()
    others = [[h["text"] for h in hyps[1:] if h["text"] != hyps[0]["text"]] for hyps in beam3["nbest"]]
    assert answer.json() == {
        "translatedText": beam3["translations"],
        "alternatives": [list(dict.fromkeys(texts)) for texts in others],
    }
    too_many = httpx.post(
        f"{server.url}/translate",
        json={"q": "Hund", "source": "de", "target": "en", "alternatives": 4, "api_key": "key-two"},
    )
    assert too_many.status_code == 400 and too_many.json()["error"].startswith(
        "Invalid request: alternatives parameter must be <= 3"
    )
    assert httpx.post(f"{server.url}/translate", json={"text": ["Hund"]}).status_code == 403  # mtrain's API too
    assert httpx.get(f"{server.url}/health").status_code == 200  # open, as the page and /languages are


def test_the_rate_limit_answers_429_per_key_over_real_http(server):
    statuses = []
    for _ in range(PER_MINUTE + 10):  # each is refused fast (no q), but counted before that
        response = httpx.post(f"{server.url}/translate", data={"source": "de", "target": "en", "api_key": "key-three"})
        statuses.append(response.status_code)
        if response.status_code == 429:
            break
    assert statuses[:PER_MINUTE] == [400] * PER_MINUTE and statuses[-1] == 429
    assert response.json()["error"].startswith(f"rate_limit_per_minute: over {PER_MINUTE} requests a minute")
    assert 1 <= int(response.headers["Retry-After"]) <= 2
    other_key = httpx.post(
        f"{server.url}/translate", data={"q": "Hund", "source": "de", "target": "en", "api_key": "key-two"}
    )
    assert other_key.status_code == 200  # each key its own budget


# ------------------------------------------------------------------ the rules, in-process
class StandIn:
    """A de->en model for the app alone: the i-th hypothesis of a sentence is it in capitals and i '!'."""

    description, name, engine_name, device, precision, threads = "stand-in", "stand-in", "torch", "cpu", "fp32", 1
    src_lang, tgt_lang = "de", "en"
    directions: ClassVar = {"de": ["en"]}
    term_aware = False  # reads no glossary terms in its source
    decoder_layers = None  # word alignments: whatever layer is asked for

    def target_languages(self) -> list[str]:
        return ["en"]

    def source_length(self, text: str, where: str = "text") -> int:
        """Source ids: one per word, and eos (what a request's constrained search costs)."""
        return len(text.split()) + 1

    def translate(self, sentences, cfg, tgt_lang=None, stop=None):
        texts = [sentence.plain for sentence in sentences]  # (the requests' texts, mtrain.decode.requests.request)
        return [
            [Hypothesis(tokens=[], score=-rank, text=s.upper() + "!" * rank) for rank in range(cfg.nbest)]
            if s.strip()
            else [Hypothesis(tokens=[], score=0.0, text="")]
            for s in texts
        ]


def app_client(**settings):
    from starlette.testclient import TestClient

    from mtrain.serve.app import build_app

    return TestClient(
        build_app(StandIn(), ServeConfig(**settings)), raise_server_exceptions=False, base_url="http://localhost"
    )


def test_one_path_two_apis_and_libretranslate_s_answers():
    with app_client(max_beam=3, decode=DecodeConfig(beam=2)) as client:
        assert client.post("/translate", json={"text": ["ein hund"]}).json()["translations"] == ["EIN HUND"]
        form = {"q": "ein hund\r\n\nzwei", "source": "auto", "target": "en", "alternatives": "1"}
        assert client.post("/translate", data=form).json() == {
            "translatedText": "EIN HUND\n\nZWEI",
            "alternatives": ["EIN HUND!\n\nZWEI!"],
            "detectedLanguage": {"confidence": 100.0, "language": "de"},
        }
        listed = {"q": ["a", "b\nc"], "source": "de", "target": "en", "alternatives": 1, "unknown": 1}
        assert client.post("/translate", json=listed).json() == {
            "translatedText": ["A", "B\nC"],
            "alternatives": [["A!"], ["B!\nC!"]],
        }
        assert client.post("/libretranslate/translate", json={"q": "a", "source": "de", "target": "en"}).json() == {
            "translatedText": "A"
        }
        # format=html: the text translated without its tags, every tag back (the stand-in aligns
        # nothing, so the element is written empty where its source word's position lands)
        html = {"q": 'ein <b class="x>y">hund</b><br>\nzwei', "source": "de", "target": "en", "format": "html"}
        assert client.post("/translate", json=html).json() == {
            "translatedText": 'EIN <b class="x>y"></b>HUND <br>\nZWEI'
        }
        for fields, error in (
            ({"source": "de", "target": "en"}, "Invalid request: missing q parameter"),
            ({"q": "a", "target": "en"}, "Invalid request: missing source parameter"),
            ({"q": "a", "source": "fr", "target": "en"}, "fr is not supported"),
            (
                {"q": "a", "source": "de", "target": "de"},
                "German (de) is not available as a target language from German (de)",
            ),
            ({"q": "a\n<b>b", "source": "de", "target": "en", "format": "html"}, "q: line 2: format=html: element"),
            ({"q": "a", "source": "de", "target": "en", "format": "xml"}, "xml format is not supported"),
            (
                {"q": "a", "source": "de", "target": "en", "alternatives": "x"},
                "Invalid request: alternatives parameter is not a number",
            ),
            (
                {"q": "a", "source": "de", "target": "en", "alternatives": 3},
                "Invalid request: alternatives parameter must be <= 2",
            ),
            ({"q": [1], "source": "de", "target": "en"}, "Invalid request: q must be a text or a list of texts"),
            ({"q": "\n".join("a" * 257), "source": "de", "target": "en"}, "max_sentences: 257 lines in one request"),
        ):
            response = client.post("/translate", json=fields)
            assert response.status_code == 400 and response.json()["error"].startswith(error), response.text
        multipart = client.post("/translate", files={"q": (None, "a")})
        assert multipart.status_code == 400 and "multipart/form-data" in multipart.json()["error"]
        assert client.get("/languages").json()[0] == {"code": "de", "name": "German", "targets": ["en"]}


def test_rate_per_client_address_keys_file_and_limiter():
    with app_client(rate_limit_per_minute=2) as client:
        statuses = [client.post("/translate", json={"text": ["a"]}).status_code for _ in range(3)]
        assert statuses == [200, 200, 429]  # no keys: counted per client address
        assert client.get("/health").status_code == 200

    now = [0.0]
    limiter = RateLimiter(60, clock=lambda: now[0])  # one a second, bursts of 60
    assert [limiter.wait("a") for _ in range(60)] == [0.0] * 60
    assert limiter.wait("a") == pytest.approx(1.0) and limiter.wait("b") == 0.0
    now[0] = 0.5
    assert limiter.wait("a") == pytest.approx(0.5)
    now[0] = 1.0
    assert limiter.wait("a") == 0.0


def test_key_file_and_settings_refused_in_one_line(tmp_path, run_dir, capsys):
    from mtrain.cli.common import check_before_run

    empty = tmp_path / "keys.txt"
    empty.write_text("# none yet\n\n", encoding="utf-8")
    with pytest.raises(MtrainError, match="holds no key"):
        read_api_keys(empty)
    for argv, line in (
        ([f"api_keys_file={tmp_path / 'missing.txt'}"], f"api_keys_file: {tmp_path / 'missing.txt'} is not a file"),
        (["rate_limit_per_minute=-1"], "rate_limit_per_minute: -1 must be >= 0"),
    ):
        with pytest.raises(SystemExit) as stop:
            check_before_run("serve", [f"run={run_dir}", *argv])
        assert stop.value.code == 2
        assert capsys.readouterr().err.startswith(f"mtrain: error: {line}")


def test_lone_surrogates_and_contradictory_terms_are_400s_with_the_json_api_s_words():
    """Issue 58: a lone surrogate in terms or avoid was a 500; terms that contradict each other
    or an avoided phrase were taken silently."""
    asked = {"q": "Ein Hund.", "source": "de", "target": "en"}
    with app_client() as client:
        for fields, error in (
            (
                {"terms": [["Hund", "\ud800"]]},
                "terms[0][1]: character 0 is a lone UTF-16 surrogate (\\ud800), not text; send valid Unicode "
                "(a surrogate pair, or UTF-8)",
            ),
            (
                {"avoid": "dog\nx\udfff"},  # a form's lines
                "avoid[1]: character 1 is a lone UTF-16 surrogate (\\udfff), not text; send valid Unicode "
                "(a surrogate pair, or UTF-8)",
            ),
            (
                {"terms": "Hund\tdog\nHund\tcat"},  # lines as in a terms= file
                "terms[1]: 'Hund' has the target 'cat' here and 'dog' in terms[0]; keep one",
            ),
            (
                {"terms": [["Hund", "hot dog"]], "avoid": ["dog"]},
                "avoid[0]: 'dog' is in the target term of terms[0] ('hot dog'): a translation cannot both hold it "
                "and avoid it; drop one of them",
            ),
        ):
            body = json.dumps({**asked, **fields}).encode()  # ASCII: a lone surrogate goes as "\\ud800"
            response = client.post("/translate", content=body, headers={"Content-Type": "application/json"})
            assert (response.status_code, response.json()) == (400, {"error": error})
        fine = client.post("/translate", json={**asked, "terms": [["Hund", "dog"]], "avoid": ["cat"]})
        assert fine.status_code == 200, fine.text
