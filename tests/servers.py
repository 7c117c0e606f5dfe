"""The server the serving tests speak to: `mtrain serve` in a subprocess on a free loopback port
(`Server`), the same server stack in a thread of the test's process (`InProcessServer`), and a
stand-in model for the app alone (`StandIn`); the decoding settings and sentences they share."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from pathlib import Path

import httpx

from mtrain.config import ServeConfig
from tests.warm_process import start_mtrain

# device=cpu: the references are decoded on the CPU here, on a machine with a GPU too.
DECODE = [
    "decode.beam=2",
    "decode.max_len_a=0.5",
    "decode.max_len_b=3",
    "num_threads=1",
    "precision=fp32",
    "device=cpu",
]
SENTENCES = [
    "Zwei junge Männer stehen vor einem Gebäude.",
    "Ein Hund.",
    "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße, während Kinder zusehen.",
    "Ein Mann fährt Fahrrad.",
    "Kinder spielen im Park.",
    "Ein Mädchen in einem rosa Kleid klettert eine Treppe hinauf.",
]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


class Server:
    """`mtrain serve ... port=0` in a subprocess; its port read from the line it logs."""

    def __init__(self, *args: str, cwd: Path) -> None:
        self.log = cwd / "serve.log"
        self.log.write_bytes(b"")
        self.process = start_mtrain("serve", "port=0", *args, cwd=cwd, env=ENV, stderr_file=self.log)
        deadline = time.monotonic() + 90
        while not (found := re.search(r"on http://127\.0\.0\.1:(\d+)\n", self.stderr())):
            assert self.process.poll() is None, f"the server exited:\n{self.stderr()}"
            assert time.monotonic() < deadline, f"the server did not start:\n{self.stderr()}"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{found.group(1)}"
        while True:  # the port is bound before the model loads: ready once /health answers
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                assert self.process.poll() is None and time.monotonic() < deadline, self.stderr()
                time.sleep(0.05)

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def post(self, body=None, **options) -> httpx.Response:
        return httpx.post(f"{self.url}/translate", json=body, timeout=60, **options)

    def post_raw(self, body) -> httpx.Response:
        """`body` as JSON with every non-ASCII character escaped: lone surrogates ("\\ud800") too."""
        return httpx.post(
            f"{self.url}/translate",
            content=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            timeout=60,
        )

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


class StandIn:
    """A model for the app alone: `translate` is given; the rest describes a de->en model."""

    def __init__(self, translate) -> None:
        self.translated = translate
        self.name, self.engine_name, self.device, self.precision, self.threads = (
            "stand-in",
            "torch",
            "cpu",
            "fp32",
            1,
        )
        self.src_lang, self.tgt_lang = "de", "en"
        self.directions = {"de": ["en"]}
        self.term_aware = False  # reads no glossary terms in its source
        self.decoder_layers = None  # word alignments: whatever layer is asked for

    def target_languages(self) -> list[str]:
        return ["en"]

    def source_length(self, text: str, where: str = "text") -> int:
        """Source ids: one per word, and eos (what a request's constrained search costs)."""
        return len(text.split()) + 1

    def translate(self, sentences, cfg, tgt_lang=None, stop=None):
        """`translate` as given, of the requests' plain texts (mtrain.decode.requests.request),
        asked to stop never (its work is done at once)."""
        return self.translated([sentence.plain for sentence in sentences], cfg, tgt_lang)


def upper_case(sentences, cfg, tgt_lang=None):
    """A stand-in's translation: the sentence in capitals."""
    from mtrain.decode.search.hypothesis import Hypothesis

    return [[Hypothesis(tokens=[], score=0.0, text=s.upper())] for s in sentences]


class InProcessServer:
    """The server `mtrain serve` runs (uvicorn with mtrain's protocol and middleware around the
    app, `serve.uvicorn_config`) in a thread of this process, on a free loopback port."""

    def __init__(self, model, **settings) -> None:
        import uvicorn

        from mtrain.cli.serve import listen, uvicorn_config
        from mtrain.serve.app import build_app

        self.cfg = ServeConfig(**settings)
        self.listener = listen("127.0.0.1", 0)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(build_app(model, self.cfg), self.cfg))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.listener]}, daemon=True)

    def __enter__(self) -> InProcessServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "the in-process server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *_) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.listener.close()
        assert not self.thread.is_alive()
