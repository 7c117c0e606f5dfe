"""Inline markup on the real server (`mtrain serve` in a subprocess): a sentence holding a
line break is refused with 422 naming it (mtrain.decode.requests.markup's contract: one line is one
sentence), never translated with its tags mixed up; the LibreTranslate API splits its text
into lines itself, so there each line is translated with its own tags."""

from __future__ import annotations

import httpx
import pytest

from mtrain.decode.requests.markup import parse_markup, tags_of
from tests.servers import DECODE, Server

SENTENCE = "Hallo Welt\nEin <b>Hund</b> läuft ."


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    started = Server(f"run={run_dir}", *DECODE, "max_sentences=8", cwd=tmp_path_factory.mktemp("markup_serve"))
    yield started
    assert started.stop() == 0, started.stderr()
    assert "Traceback" not in started.stderr()


@pytest.mark.parametrize("fmt", ["html", "xml"])
def test_a_line_break_inside_a_sentence_is_refused_with_422(server, fmt):
    response = server.post({"text": ["Ein Hund.", SENTENCE], "format": fmt})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert "text[1]" in error and f"format={fmt}: a line break at column 11" in error, error
    assert server.post({"text": SENTENCE.split("\n"), "format": fmt}).status_code == 200  # one line each


def test_libretranslate_translates_each_line_with_its_own_tags(server):
    body = {"q": SENTENCE, "source": "de", "target": "en", "format": "html"}
    response = httpx.post(f"{server.url}/translate", json=body, timeout=60)
    assert response.status_code == 200, response.text
    first, second = response.json()["translatedText"].split("\n")
    assert tags_of(parse_markup(first, "html")) == []
    assert tags_of(parse_markup(second, "html")) == ["<b>", "</b>"]
