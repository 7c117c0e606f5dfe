"""Record what translate, eval and serve (both HTTP APIs) answer for every decoding control,
so that two checkouts can be compared byte for byte (a refactoring of the decode path must
not change a single output).

    python scripts/record_decode_outputs.py WORK_DIR OUT.json      # with this checkout
    PYTHONPATH=/other/checkout python /other/checkout/scripts/... WORK_DIR OTHER.json
    diff <(python -m json.tool OUT.json) <(python -m json.tool OTHER.json)

WORK_DIR holds the runs (tiny untrained models: their outputs vary, a fine test of every
choice); it is made once and reused, so both checkouts decode the very same models. Each
command runs as its own process with the PYTHONPATH it was started with. Takes 2-4 minutes
on 2 cores.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SENTENCES = [
    "Zwei junge Männer stehen vor einem Gebäude.",
    "Ein Hund.",
    "",
    "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße, während Kinder zusehen.",
    "Ein Mann fährt Fahrrad.",
]
MARKUP = [
    "Zwei <b>junge</b> Männer stehen vor einem Gebäude.",
    'Ein <a href="x">Hund</a>.<br/>',
    "Ein Mann fährt <i>Fahrrad</i>.",
]
SHORT = ["decode.max_len_a=0.5", "decode.max_len_b=4", "num_threads=1", "device=cpu", "precision=fp32"]
MBR = ["decode.mbr.candidates=both", "decode.mbr.num_candidates=4"]


def make_runs(work: Path) -> dict[str, Path]:
    """deen (a run), ende (its reverse, same tokenizer), export (deen for CTranslate2), and the files."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from mtrain.decode.selection.rerank import RerankWeights, write_weights
    from tests.conftest import train_spm_tokenizer
    from tests.decoding_run import write_config, write_test_run

    data = Path(os.environ.get("MTRAIN_DATA_DIR", "/work/shared/data"))
    tokenizer = train_spm_tokenizer(work / "spm", data, 0)
    runs = {
        "deen": write_config(write_test_run(work / "deen", tokenizer, seed=0, update=3), "de", "en"),
        "ende": write_config(write_test_run(work / "ende", tokenizer, seed=1, update=3), "en", "de"),
    }
    write_weights(work / "weights.json", RerankWeights(["forward", "reverse", "length_ratio"], [1.0, 0.5, 0.3]))
    write_weights(
        work / "weights_mbr.json", RerankWeights(["forward", "reverse", "length_ratio", "mbr"], [1.0, 0.5, 0.3, 2.0])
    )
    (work / "plain.de").write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    (work / "markup.de").write_text("".join(s + "\n" for s in MARKUP), encoding="utf-8")
    (work / "tabbed.de").write_text(
        "Zwei junge Männer stehen vor einem Gebäude.\tmen\tbuilding\nEin Hund.\tdog\n\n"
        "Eine Frau spielt Gitarre.\tguitar\tA woman\nEin Mann fährt Fahrrad.\n",
        encoding="utf-8",
    )
    (work / "prefix.txt").write_text("Two\nA\n\n\nThe man\n", encoding="utf-8")
    (work / "terms.tsv").write_text("Hund\tdog\nMänner\tmen\nGitarre\tguitar\nFahrrad\tbicycle\n", encoding="utf-8")
    (work / "avoid.txt").write_text("the\nA\n", encoding="utf-8")
    (work / "marker").write_text("made\n")
    return runs


def mtrain(*args: str, cwd: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "mtrain", *args],
        cwd=cwd,
        capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    errors = [line for line in done.stderr.decode(errors="replace").splitlines() if "error" in line.lower()]
    return {"status": done.returncode, "stdout": done.stdout.decode("utf-8", "replace"), "errors": errors[-1:]}


TRANSLATE_CASES: dict[str, list[str]] = {
    "beam5": [],
    "greedy": ["decode.beam=1"],
    "nbest": ["decode.beam=4", "decode.nbest=3"],
    "sampling": ["decode.sampling=topk", "decode.top_k=5", "decode.nbest=3"],
    "mbr": MBR,
    "mbr_nbest": [*MBR, "decode.nbest=2"],
    "rerank": ["decode.rerank.weights={work}/weights.json", "decode.rerank.reverse_run={work}/ende", "decode.nbest=2"],
    "mbr_rerank": [*MBR, "decode.rerank.weights={work}/weights_mbr.json", "decode.rerank.reverse_run={work}/ende"],
    "constraints": ["input={work}/tabbed.de", "constraints=unordered"],
    "constraints_ordered": ["input={work}/tabbed.de", "constraints=ordered", "decode.nbest=2"],
    "terms": ["terms={work}/terms.tsv"],
    "terms_ignore_case": ["terms={work}/terms.tsv", "terms_ignore_case=true"],
    "prefix": ["prefix={work}/prefix.txt"],
    "avoid": ["avoid={work}/avoid.txt"],
    "prefix_terms_avoid": ["prefix={work}/prefix.txt", "terms={work}/terms.tsv", "avoid={work}/avoid.txt"],
    "alignment": ["decode.alignment=true"],
    "alignment_subword": ["decode.alignment=subword", "decode.nbest=2"],
    "xml": ["input={work}/markup.de", "format=xml"],
    "html_alignment": ["input={work}/markup.de", "format=html", "decode.alignment=word"],
    "html_terms": ["input={work}/markup.de", "format=html", "terms={work}/terms.tsv"],
    # refusals: one line, exit 2
    "refuse_mbr_terms": [*MBR, "terms={work}/terms.tsv"],
    "refuse_rerank_prefix": ["decode.rerank.weights={work}/weights.json", "prefix={work}/prefix.txt"],
    "refuse_mbr_markup": [*MBR, "input={work}/markup.de", "format=html"],
    "refuse_mbr_alignment": [*MBR, "decode.alignment=true"],
    "refuse_sampling_terms": ["decode.sampling=topk", "terms={work}/terms.tsv"],
    "refuse_ct2_terms": ["engine=ctranslate2", "terms={work}/terms.tsv"],
}


def translate_cases(work: Path, deen: Path) -> dict[str, Any]:
    results = {}
    for name, extra in TRANSLATE_CASES.items():
        args = [arg.format(work=work) for arg in extra]
        if not any(arg.startswith("input=") for arg in args):
            args.append(f"input={work}/plain.de")
        results[name] = mtrain("translate", f"run={deen}", *SHORT, *args, cwd=work)
    return results


def eval_cases(work: Path, deen: Path) -> dict[str, Any]:
    results = {}
    cases = {
        "beam5": [],
        "mbr": MBR,
        "rerank": ["decode.rerank.weights={work}/weights.json", "decode.rerank.reverse_run={work}/ende"],
        "alignment": ["decode.alignment=true"],
    }
    for name, extra in cases.items():
        out = work / f"eval_{name}"
        done = mtrain("eval", f"run={deen}", f"out={out}", *SHORT, *(a.format(work=work) for a in extra), cwd=work)
        files = {
            p.name: p.read_text(encoding="utf-8") for p in sorted(out.glob("test.*")) if p.suffix in (".hyp", ".align")
        }
        report = json.loads((out / "test.json").read_text()) if (out / "test.json").is_file() else {}
        scores = {k: v.get("score") for k, v in report.get("metrics", {}).items()} if report else {}
        results[name] = {"status": done["status"], "errors": done["errors"], "files": files, "scores": scores}
    return results


class Server:
    def __init__(self, work: Path, *args: str) -> None:
        self.log = work / "serve.log"
        with self.log.open("wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mtrain", "serve", "port=0", *args],
                cwd=work,
                stderr=err,
                stdout=subprocess.DEVNULL,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
        import httpx

        self.httpx = httpx
        deadline = time.monotonic() + 120
        while not (found := re.search(r"on http://127\.0\.0\.1:(\d+)\n", self.log.read_text())):
            if self.process.poll() is not None:
                raise RuntimeError(self.log.read_text())
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{found.group(1)}"
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)

    def post(self, body: dict, form: bool = False) -> dict[str, Any]:
        if form:
            answer = self.httpx.post(f"{self.url}/translate", data=body, timeout=120)
        else:
            answer = self.httpx.post(f"{self.url}/translate", json=body, timeout=120)
        return {"status": answer.status_code, "body": answer.json()}

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=60)


JSON_REQUESTS: dict[str, dict[str, Any]] = {
    "plain": {"text": SENTENCES},
    "nbest": {"text": SENTENCES, "beam": 4, "nbest": 3},
    "alignment": {"text": SENTENCES, "alignment": True},
    "xml": {"text": MARKUP, "format": "xml"},
    "html_alignment": {"text": MARKUP, "format": "html", "alignment": True},
    "prefix": {"text": SENTENCES, "prefix": ["Two", "A", None, None, "The man"]},
    "constraints": {"text": SENTENCES, "constraints": [["men", "building"], ["dog"], [], ["guitar"], []]},
    "avoid": {"text": SENTENCES, "avoid": ["the", "A"]},
}
LIBRE_REQUESTS: dict[str, dict[str, Any]] = {
    "plain": {"q": "\n".join(SENTENCES), "source": "de", "target": "en"},
    "list": {"q": SENTENCES[:2], "source": "de", "target": "en"},
    "alternatives": {"q": SENTENCES[0], "source": "de", "target": "en", "alternatives": 2},
    "html": {"q": MARKUP[0], "source": "de", "target": "en", "format": "html"},
}


def serve_cases(work: Path, deen: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    servers = {
        "beam": [],
        "mbr": MBR,
        "rerank": ["decode.rerank.weights={work}/weights.json", "decode.rerank.reverse_run={work}/ende"],
    }
    for server_name, extra in servers.items():
        server = Server(work, f"run={deen}", *SHORT, *(a.format(work=work) for a in extra))
        try:
            for name, body in JSON_REQUESTS.items():
                results[f"{server_name}/json/{name}"] = server.post(body)
            for name, body in LIBRE_REQUESTS.items():
                results[f"{server_name}/libre/{name}"] = server.post(body)
            results[f"{server_name}/libre/form"] = server.post(LIBRE_REQUESTS["plain"], form=True)
        finally:
            server.stop()
    return results


def main() -> None:
    work, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    if not (work / "marker").is_file():
        make_runs(work)
    deen = work / "deen"
    only = sys.argv[3].split(",") if len(sys.argv) > 3 else ["translate", "eval", "serve"]
    record: dict[str, Any] = {}
    if "translate" in only:
        record["translate"] = translate_cases(work, deen)
    if "eval" in only:
        record["eval"] = eval_cases(work, deen)
    if "serve" in only:
        record["serve"] = serve_cases(work, deen)
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
