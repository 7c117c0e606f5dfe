"""Translating sentences, files and streams; the `mtrain translate` command end to end."""

from __future__ import annotations

import gzip
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from mtrain.config import DecodeConfig, ModelConfig, TranslateConfig
from mtrain.decode.requests.controls import (
    LineControls,
    encode_request,
    line_controls,
    split_constraints,
)
from mtrain.decode.requests.request import DecodeRequest
from mtrain.decode.requests.terminology import Glossary
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decode.text.attention_plot import DPI, figure_size
from mtrain.decode.text.stream import translate_stream, typed_lines
from mtrain.decode.text.textio import InputRepairs, decode_line, read_chunks
from mtrain.decode.translation.translator import token_budget_batches, translate_sentences
from mtrain.errors import MtrainError
from mtrain.model import build_model
from tests.decoding_run import TINY_MODEL, job
from tests.warm_process import run_mtrain

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = TINY_MODEL  # the shared `model` fixture's (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models


SENTENCES = [
    "Zwei junge Männer stehen vor einem Gebäude.",
    "Ein Hund.",
    "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße, während Kinder zusehen.",
    "Ein Mann fährt Fahrrad.",
]


# ------------------------------------------------------------------ sentences
def test_token_budget_batches_respect_the_budget():
    lengths = [5, 30, 7, 7, 12, 3, 50, 1]
    batches = token_budget_batches(lengths, max_tokens=40)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        longest = max(lengths[i] for i in batch)
        assert len(batch) * longest <= 40 or len(batch) == 1
    assert [6] in batches  # over the budget: alone


def test_translate_sentences_keeps_order_and_matches_one_by_one(model, tokenizer):
    cfg = DecodeConfig(beam=3, nbest=2, max_len_a=0.5, max_len_b=3, max_tokens=40)  # several batches
    together = translate_sentences(model, tokenizer, SENTENCES + [""], cfg, "cpu")
    assert len(together) == len(SENTENCES) + 1
    for sentence, hyps in zip(SENTENCES, together[:-1], strict=True):  # the last is the blank line
        alone = translate_sentences(model, tokenizer, [sentence], cfg, "cpu")[0]
        assert [h.tokens for h in alone] == [h.tokens for h in hyps]
        assert [h.text for h in alone] == [h.text for h in hyps] == [tokenizer.decode_tgt(h.tokens) for h in hyps]
        assert len(hyps) == 2
    assert together[-1][0].text == "" and together[-1][0].tokens == []


def test_stop_ends_a_decode_between_batches_of_any_engine_and_at_every_step_of_mtrain_s(model, tokenizer):
    """`stop` (the server's deadline, issue 58): an engine that cannot ask at every step
    (CTranslate2's) is stopped before its next batch; mtrain's own asks at every step."""
    from mtrain.decode.search.generator import DecodeStopped
    from mtrain.decode.translation.translator import translate_encoded

    sources = [tokenizer.encode_src(s) + [tokenizer.eos_id] for s in SENTENCES]
    cfg = DecodeConfig(beam=2, max_len_a=0.5, max_len_b=3, max_tokens=40)  # several batches

    class OneStepEngine:  # decodes a batch at once, as CTranslate2 does, and takes no `stop`
        def __init__(self) -> None:
            self.batches = 0

        def translate_batch(self, batch, cfg, attention_layer=None):
            self.batches += 1
            return [[Hypothesis(tokens=[5], score=0.0)] for _ in batch]

    engine = OneStepEngine()
    with pytest.raises(DecodeStopped, match="stopped before a batch of"):
        translate_encoded(engine, tokenizer, sources, cfg, "cpu", stop=lambda: engine.batches == 2)
    assert engine.batches == 2
    asked = []
    with pytest.raises(DecodeStopped, match="stopped at step 2 of"):
        translate_encoded(model, tokenizer, sources, cfg, "cpu", stop=lambda: asked.append(1) or len(asked) > 3)
    assert len(asked) == 4  # 1 before the batch, then 1 before each step: it stopped at its third step


def test_translate_sentences_restores_training_mode(model, tokenizer):
    model.train()
    translate_sentences(model, tokenizer, SENTENCES[:1], DecodeConfig(beam=1, max_len_b=2), "cpu")
    assert model.training
    model.eval()


# ------------------------------------------------------------------ files and streams
def test_lines_blank_lines_and_line_count_preserved(model, tokenizer, tmp_path):
    source = tmp_path / "in.de"
    source.write_bytes("\n".join([SENTENCES[0], "", "   ", SENTENCES[1], "", SENTENCES[3]]).encode() + b"\n\n")
    output = tmp_path / "out" / "hyp.en"
    report = translate_stream(model, tokenizer, job(input=str(source), output=str(output)), torch.device("cpu"), "fp32")
    lines = output.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == 7 == report.lines
    assert lines[1] == lines[2] == lines[4] == lines[6] == ""
    expected = translate_sentences(model, tokenizer, [SENTENCES[0], SENTENCES[1], SENTENCES[3]], job().decode, "cpu")
    assert [lines[0], lines[3], lines[5]] == [h[0].text for h in expected]


def test_crlf_and_unicode_line_separators_do_not_change_line_count(model, tokenizer, tmp_path):
    source = tmp_path / "in.de"
    source.write_bytes(("Ein Hund\u2028läuft.\r\nEin Mann.\r\n").encode())
    output = tmp_path / "hyp.en"
    translate_stream(model, tokenizer, job(input=str(source), output=str(output)), torch.device("cpu"), "fp32")
    assert output.read_text(encoding="utf-8").count("\n") == 2


def test_over_long_line_is_truncated_with_a_warning_naming_it(model, tokenizer, tmp_path, caplog):
    long_line = " ".join(SENTENCES * 4)
    source = tmp_path / "in.de"
    source.write_text(f"{SENTENCES[1]}\n{SENTENCES[3]}\n{long_line}\n", encoding="utf-8")
    output = tmp_path / "hyp.en"
    with caplog.at_level(logging.WARNING, logger="mtrain"):
        report = translate_stream(
            model,
            tokenizer,
            job(input=str(source), output=str(output), max_input_tokens=20),
            torch.device("cpu"),
            "fp32",
        )
    assert report.truncated_lines == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"{source}:3:") and "truncated to the first 19" in warnings[0]
    assert output.read_text(encoding="utf-8").count("\n") == 3


def test_model_position_limit_caps_inputs(model, tokenizer, tmp_path, caplog):
    source = tmp_path / "in.de"
    source.write_text(" ".join(SENTENCES * 12) + "\n", encoding="utf-8")  # far beyond 64 positions
    with caplog.at_level(logging.WARNING, logger="mtrain"):
        translate_stream(
            model,
            tokenizer,
            job(input=str(source), output=str(tmp_path / "o"), max_input_tokens=1024),
            torch.device("cpu"),
            "fp32",
        )
    assert "truncated to the first 63" in caplog.text


def test_undecodable_bytes_are_replaced_and_counted(model, tokenizer, tmp_path, caplog):
    assert decode_line(b"Ein \xff\xfe Hund") == ("Ein \ufffd\ufffd Hund", 2)
    assert decode_line("Grüße".encode()) == ("Grüße", 0)
    stats = InputRepairs()
    chunks = list(read_chunks(io.BytesIO(b"gut\nschlecht \x80\n\nauch \xc3\n"), 2, stats))
    assert chunks == [["gut", "schlecht \ufffd"], ["", "auch \ufffd"]]
    assert (stats.lines, stats.undecodable_bytes, stats.undecodable_lines, stats.first_undecodable_line) == (4, 2, 2, 2)
    source = tmp_path / "in.de"
    source.write_bytes(b"Ein Hund.\nEin \xff Mann \xfe\xfd.\n")
    output = tmp_path / "hyp.en"
    with caplog.at_level(logging.WARNING, logger="mtrain"):
        report = translate_stream(
            model, tokenizer, job(input=str(source), output=str(output)), torch.device("cpu"), "fp32"
        )
    assert (report.undecodable_bytes, report.undecodable_lines) == (3, 1)
    assert "3 bytes on 1 lines were not UTF-8 (first on line 2)" in caplog.text
    assert output.read_text(encoding="utf-8").count("\n") == 2


def test_directory_or_missing_input_is_a_clear_error(model, tokenizer, tmp_path):
    with pytest.raises(MtrainError, match="is a directory"):
        translate_stream(model, tokenizer, job(input=str(tmp_path)), torch.device("cpu"), "fp32")
    with pytest.raises(MtrainError, match="no such file"):
        translate_stream(model, tokenizer, job(input=str(tmp_path / "nope.de")), torch.device("cpu"), "fp32")


def test_a_line_over_max_line_chars_is_refused_naming_the_input_line_and_key(model, tokenizer, tmp_path):
    """Refused as it is read, before a byte is written; the same bound holds for prefix=, for
    interactive (typed) input and for a device that never sends a newline."""
    source, output = tmp_path / "in.de", tmp_path / "out.en"
    source.write_text(f"{SENTENCES[1]}\n{'Hund ' * 30}\n{SENTENCES[0]}\n", encoding="utf-8")  # line 2: 150 chars
    with pytest.raises(MtrainError) as error:
        translate_stream(
            model,
            tokenizer,
            job(input=str(source), output=str(output), max_line_chars=149),
            torch.device("cpu"),
            "fp32",
        )
    assert str(error.value).startswith(f"input={source}:2: a line of more than 149 characters (max_line_chars=149)")
    assert not output.exists()
    for interactive in (False, True):
        with pytest.raises(MtrainError, match=r"^input=/dev/zero:1: a line of more than 1,000 characters"):
            translate_stream(
                model,
                tokenizer,
                job(input="/dev/zero", output=str(output), max_line_chars=1000, interactive=interactive),
                torch.device("cpu"),
                "fp32",
            )
    prefix = tmp_path / "prefix.en"
    prefix.write_text("A\n" + "B" * 200 + "\nC\n", encoding="utf-8")
    with pytest.raises(MtrainError, match=rf"^prefix={prefix}:2: a line of more than 150 characters"):
        translate_stream(
            model,
            tokenizer,
            job(input=str(source), output=str(output), prefix=str(prefix), max_line_chars=150),
            torch.device("cpu"),
            "fp32",
        )
    # At the default bound the 150-character line is translated.
    translate_stream(model, tokenizer, job(input=str(source), output=str(output)), torch.device("cpu"), "fp32")
    assert output.read_text(encoding="utf-8").count("\n") == 3


def test_typed_lines_refuse_a_line_over_the_bound_as_it_arrives():
    endless = io.BytesIO(b"ein Hund\n" + b"x" * 100_000)  # no newline after line 2 yet
    lines = typed_lines(endless, None, "stdin", max_chars=100)
    assert next(lines) == b"ein Hund\n"
    with pytest.raises(MtrainError, match=r"^stdin:2: a line of more than 100 characters \(max_line_chars=100\)"):
        next(lines)
    assert endless.tell() < 100 * 4 + 2 + 2 * (1 << 16)  # refused while reading, not at the end


def test_nbest_output_is_tsv(model, tokenizer, tmp_path):
    source = tmp_path / "in.de"
    source.write_text(f"{SENTENCES[0]}\n\n{SENTENCES[1]}\n", encoding="utf-8")
    output = tmp_path / "nbest.tsv"
    translate_stream(
        model,
        tokenizer,
        job(input=str(source), output=str(output), decode={"beam": 4, "nbest": 3}),
        torch.device("cpu"),
        "fp32",
    )
    rows = [line.split("\t") for line in output.read_text(encoding="utf-8").splitlines()]
    assert all(len(row) == 3 for row in rows)
    assert [row[0] for row in rows] == ["0", "0", "0", "1", "2", "2", "2"]
    assert rows[3][2] == ""
    first = [float(row[1]) for row in rows[:3]]
    assert first == sorted(first, reverse=True)
    expected = translate_sentences(model, tokenizer, [SENTENCES[0]], job(decode={"beam": 4, "nbest": 3}).decode, "cpu")[
        0
    ]
    assert [row[2] for row in rows[:3]] == [h.text for h in expected]
    assert first == pytest.approx([h.score for h in expected], abs=1e-4)


@pytest.mark.parametrize("layer", ["last", "all"])
def test_attention_pictures_one_png_per_sentence(model, tokenizer, tmp_path, layer):
    source = tmp_path / "in.de"
    source.write_text(f"{SENTENCES[1]}\n\n{SENTENCES[3]}\n", encoding="utf-8")
    pictures = tmp_path / "att"
    translate_stream(
        model,
        tokenizer,
        job(input=str(source), output=str(tmp_path / "hyp.en"), attention=str(pictures), attention_layer=layer),
        torch.device("cpu"),
        "fp32",
    )
    assert sorted(p.name for p in pictures.iterdir()) == ["000001.png", "000003.png"]
    expected = translate_sentences(model, tokenizer, [SENTENCES[1]], job().decode, "cpu")[0][0]
    num_src = len(tokenizer.encode_src(SENTENCES[1])) + 1
    num_tgt = len(expected.tokens) + 1
    width, height = figure_size(num_src, num_tgt, panels=2 if layer == "all" else 1)
    assert Image.open(pictures / "000001.png").size == (round(width * DPI), round(height * DPI))


def test_bad_attention_layer_is_a_clear_error(model, tokenizer, tmp_path):
    source = tmp_path / "in.de"
    source.write_text("Ein Hund.\n", encoding="utf-8")
    for layer in ("middle", "5"):
        with pytest.raises(MtrainError, match="attention_layer"):
            translate_stream(
                model,
                tokenizer,
                job(
                    input=str(source), output=str(tmp_path / "o"), attention=str(tmp_path / "a"), attention_layer=layer
                ),
                torch.device("cpu"),
                "fp32",
            )


# ------------------------------------------------------------------ the command
def mtrain(*args: str, stdin: bytes = b"", cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return run_mtrain(*args, input=stdin, cwd=cwd, env=env, timeout=120)


def test_translate_command_pipes_stdin_to_clean_stdout(run_dir, model, tokenizer, tmp_path):
    text = f"{SENTENCES[0]}\n\n{SENTENCES[1]}\n".encode()
    result = mtrain(
        "translate",
        f"run={run_dir}",
        "decode.beam=2",
        "decode.max_len_a=0.5",
        "decode.max_len_b=3",
        "num_threads=1",
        "precision=fp32",
        stdin=text,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr.decode()
    expected = translate_sentences(model, tokenizer, [SENTENCES[0], SENTENCES[1]], job().decode, "cpu")
    assert result.stdout.decode().split("\n") == [expected[0][0].text, "", expected[1][0].text, ""]
    assert b"translating with" in result.stderr  # logs go to stderr
    # The thread count is said once, in the line that starts the work, in agreement with its number.
    assert result.stderr.decode().count("CPU thread") == 1 and b"1 CPU thread (num_threads=1)" in result.stderr
    assert b"translated 3 lines" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no outputs/, .hydra/ or log file


def test_translate_command_errors_are_one_line(run_dir, tmp_path):
    result = mtrain("translate", f"run={run_dir}", f"input={tmp_path}", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.decode().strip().splitlines() == [
        f"mtrain: error: input={tmp_path}: is a directory; give a text file (one sentence per line) or omit input= to read stdin"
    ]
    # Refused once the threads are set (the checkpoint is looked for after them): still the error alone.
    result = mtrain("translate", f"run={run_dir}", "checkpoint=nope", stdin=b"Ein Hund.\n", cwd=tmp_path)
    assert result.returncode == 2
    assert [line for line in result.stderr.decode().splitlines() if line.strip()] == [
        f"mtrain: error: checkpoint=nope: no such file (looked in . and {run_dir / 'checkpoints'})"
    ]


def test_translate_command_refuses_a_huge_line_in_one_line(run_dir, tmp_path):
    source = tmp_path / "huge.de"
    source.write_bytes(b"Ein Hund. " * 30_000 + b"\n")  # 300,000 characters on one line
    result = mtrain("translate", f"run={run_dir}", f"input={source}", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == b""
    assert [line for line in result.stderr.decode().splitlines() if "error" in line or "Traceback" in line] == [
        f"mtrain: error: input={source}:1: a line of more than 200,000 characters (max_line_chars=200000); "
        "a line is one sentence or paragraph: split the text into lines, or raise max_line_chars"
    ]


def _translate_command(run_dir: Path, *args: str) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "mtrain",
        "translate",
        f"run={run_dir}",
        "decode.beam=1",
        "decode.max_len_a=0.5",
        "decode.max_len_b=3",
        "num_threads=1",
        "precision=fp32",
    ]
    return command + list(args)


def test_translate_into_a_full_disk_or_a_closed_stream_is_one_line(run_dir, tmp_path):
    source = tmp_path / "in.de"
    source.write_text("".join(f"{s}\n" for s in SENTENCES * 5), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open("/dev/full", "wb") as full:  # every write: ENOSPC
        result = subprocess.run(
            _translate_command(run_dir, f"input={source}"),
            stdout=full,
            stderr=subprocess.PIPE,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
    errors = [line for line in result.stderr.decode().splitlines() if not line.startswith("mtrain: INFO")]
    assert result.returncode == 2, result.stderr.decode()
    assert errors == [
        "mtrain: error: output: could not write to stdout (No space left on device); the translations "
        "written so far are incomplete. Free space where stdout goes, or give output=FILE"
    ]

    # The shell closed stdin (`<&-`): Python's sys.stdin is None.
    result = subprocess.run(
        _translate_command(run_dir),
        stdin=None,
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        preexec_fn=lambda: os.close(0),
    )
    assert result.returncode == 2, result.stderr.decode()
    assert result.stderr.decode().splitlines() == [
        "mtrain: error: input: stdin is closed; give input=FILE, or pipe the text in"
    ]
    # stdin closed with input= given reads the file and needs no stdin.
    result = subprocess.run(
        _translate_command(run_dir, f"input={source}", f"output={tmp_path / 'out.en'}"),
        capture_output=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        preexec_fn=lambda: os.close(0),
    )
    assert result.returncode == 0, result.stderr.decode()
    assert len((tmp_path / "out.en").read_text(encoding="utf-8").splitlines()) == len(SENTENCES) * 5


def test_translate_into_a_reader_that_went_away_exits_141_quietly(run_dir, tmp_path):
    """`mtrain translate ... | head -1`: the reader is gone before the translations come."""
    source = tmp_path / "in.de"
    source.write_text("".join(f"{s}\n" for s in SENTENCES), encoding="utf-8")
    process = subprocess.Popen(
        _translate_command(run_dir, f"input={source}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
    )
    process.stdout.close()  # as head does once it has its line
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 141, stderr.decode()
    assert "Traceback" not in stderr.decode() and "Exception ignored" not in stderr.decode()


def test_translate_config_composes_and_rejects_typos():
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException

    from mtrain.cli.common import CONFIG_DIR
    from mtrain.cli.translate import run_translate

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("translate", overrides=["decode=greedy", "attention_layer=1"])
        assert cfg.decode.beam == 1 and cfg.input is None and cfg.output is None and cfg.precision == "auto"
        assert compose("translate").decode.beam == 5
        with pytest.raises(ConfigCompositionException):
            compose("translate", overrides=["decode.beem=3"])
    with pytest.raises(MtrainError, match="run=RUN_DIR is missing"):
        run_translate(cfg)


def test_output_appears_only_once_complete(tmp_path):
    from mtrain.decode.text.textio import write_output

    out = tmp_path / "out.txt"
    out.write_text("an earlier translation\n", encoding="utf-8")

    def disk_full(sink):
        sink.write("half a translation\n")
        raise OSError(28, "No space left on device")

    with pytest.raises(MtrainError, match="output=.*No space left.*no output file was written"):
        write_output(str(out), disk_full)
    assert out.read_text(encoding="utf-8") == "an earlier translation\n"  # intact
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary file left behind
    write_output(str(out), lambda sink: sink.write("a b\nc\n"))
    assert out.read_text(encoding="utf-8") == "a b\nc\n"


def test_an_export_directory_holds_one_model_so_checkpoint_is_refused(tmp_path):
    """An `mtrain export` directory is decoded by CTranslate2 whatever engine= says
    (tests/test_export.py); choosing one of a run's checkpoints there is refused, naming the key."""
    from mtrain.cli.translate import run_translate
    from mtrain.decode.engines.ct2_engine import METADATA_FILE

    export = tmp_path / "m30k_ct2"
    export.mkdir()
    (export / METADATA_FILE).write_text("{}", encoding="utf-8")
    cfg = TranslateConfig(run=str(export), device="cpu", checkpoint="last")
    with pytest.raises(
        MtrainError, match=r"^checkpoint=last: run=.* is a CTranslate2 model written by `mtrain export`"
    ):
        run_translate(cfg)


# ------------------------------------------------------------------ interactive
def _read_line(fd: int, timeout: float) -> bytes:
    """One line from `fd`, or AssertionError after `timeout` seconds without one."""
    import select
    import time

    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        assert ready, f"no line within {timeout}s (read so far: {data!r})"
        byte = os.read(fd, 1)  # one byte at a time: nothing of the next line is consumed
        assert byte, f"end of output before a line (read so far: {data!r})"
        data += byte
    return data


def _foreground_job() -> None:
    """In the child, before exec: a shell's foreground job at the pseudo-terminal. It takes the
    terminal as its controlling one, and SIGINT back to its default: a suite started in the
    background (`pytest ... &`, nohup) ignores SIGINT, every process it starts inherits that, and
    a Python that starts with SIGINT ignored never raises KeyboardInterrupt (the test waited
    60 s for an exit that could not come)."""
    import fcntl
    import signal
    import termios

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _start_on_a_terminal(run_dir: Path, cwd: Path, *args: str) -> tuple[subprocess.Popen, int]:
    """`mtrain translate` with its stdin on a pseudo-terminal, which is also its controlling
    terminal (so Ctrl-C typed there is SIGINT, as in a shell); stdout and stderr are pipes.
    The process and the terminal's master side, for typing."""
    import termios

    master, slave = os.openpty()
    attributes = termios.tcgetattr(slave)
    attributes[3] &= ~termios.ECHO  # no echo to drain: we read the translations from stdout
    termios.tcsetattr(slave, termios.TCSANOW, attributes)
    process = subprocess.Popen(
        _translate_command(run_dir, *args),
        stdin=slave,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,
        preexec_fn=_foreground_job,  # noqa: PLW1509 - no threads yet in the child
    )
    os.close(slave)
    return process, master


STARTUP_S = 120  # python, torch and the model on 2 busy cores; each later line takes well under a second


def test_is_interactive_follows_the_key_then_the_terminal():
    from mtrain.decode.text.stream import is_interactive

    assert not sys.stdin or not sys.stdin.isatty()  # pytest's stdin: not a terminal
    assert is_interactive(job()) is False
    assert is_interactive(job(interactive=True)) is True
    assert is_interactive(job(interactive=False)) is False


def test_interactive_on_a_terminal_answers_each_line_before_the_next_then_ends_on_ctrl_d(
    run_dir, model, tokenizer, tmp_path
):
    process, master = _start_on_a_terminal(run_dir, tmp_path)
    try:
        lines = [SENTENCES[1], "", SENTENCES[3]]
        got = []
        for number, line in enumerate(lines):
            os.write(master, line.encode() + b"\n")  # stdin stays open: no chunk could be filled
            got.append(_read_line(process.stdout.fileno(), STARTUP_S if number == 0 else 30).decode())
        os.write(master, b"\x04")  # Ctrl-D at the start of a line: end of input
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        os.close(master)
    assert process.returncode == 0, stderr.decode()
    expected = translate_sentences(model, tokenizer, lines, job(decode={"beam": 1}).decode, "cpu")
    assert got == [hyps[0].text + "\n" for hyps in expected]
    assert expected[0][0].text and got[1] == "\n"
    assert b"translated 3 lines" in stderr and b"> " not in stderr  # no prompt: stderr is no terminal


def test_interactive_true_on_a_pipe_answers_each_line_before_the_next_with_nbest(run_dir, model, tokenizer, tmp_path):
    process = subprocess.Popen(
        _translate_command(run_dir, "interactive=true", "decode.beam=3", "decode.nbest=2"),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        rows = []
        for number, line in enumerate(SENTENCES[:2]):
            process.stdin.write(line.encode() + b"\n")
            process.stdin.flush()
            for _ in range(2):
                rows.append(_read_line(process.stdout.fileno(), STARTUP_S if number == 0 else 30).decode())
        _, stderr = process.communicate(timeout=60)  # closes stdin: end of input
    finally:
        process.kill()
    assert process.returncode == 0, stderr.decode()
    decode = job(decode={"beam": 3, "nbest": 2}).decode
    expected = translate_sentences(model, tokenizer, SENTENCES[:2], decode, "cpu")
    fields = [row.rstrip("\n").split("\t") for row in rows]
    assert [f[0] for f in fields] == ["0", "0", "1", "1"]
    assert [f[2] for f in fields] == [h.text for hyps in expected for h in hyps]
    assert [float(f[1]) for f in fields] == pytest.approx([h.score for hyps in expected for h in hyps], abs=1e-4)


def test_ctrl_c_at_the_terminal_exits_130_without_a_traceback(run_dir, tmp_path):
    process, master = _start_on_a_terminal(run_dir, tmp_path)
    try:
        os.write(master, SENTENCES[1].encode() + b"\n")
        assert _read_line(process.stdout.fileno(), STARTUP_S).strip()  # waiting for the next line now
        os.write(master, b"\x03")  # Ctrl-C: the terminal sends SIGINT to the process
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
        os.close(master)
    assert process.returncode == 130, stderr.decode()
    assert "Traceback" not in stderr.decode()
    assert stderr.decode().splitlines()[-1] == "mtrain: interrupted"


# ------------------------------------------------------------------ prefixes, constraints, terms, avoid
def test_fairseq_constraint_lines_and_requests(tokenizer):
    assert split_constraints("Ein Hund.\tdog\t\tbig cat") == ("Ein Hund.", ("dog", "big cat"))
    controls = LineControls(tabbed_constraints=True, glossary=Glossary.of({"Hund": "dog"}), avoid=("cat",))
    request = controls.request("Ein Hund.\tdog\tball", prefix="A", where="input:1")
    assert request == DecodeRequest("Ein Hund.", "A", ("dog", "ball"), ("cat",), where="input:1")
    ids = encode_request(tokenizer, request)
    assert ids is not None and ids.constraints[0] == tuple(tokenizer.encode_tgt("dog"))
    assert tokenizer.tgt_pieces(ids.constraints[0])[0].startswith("\u2581")  # a word after a space
    assert encode_request(tokenizer, DecodeRequest("Ein Hund.", " ", ("",), ())) is None


def translate_file(model, tokenizer, tmp_path, lines, controls=None, **overrides):
    source = tmp_path / "in.txt"
    source.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    out = tmp_path / "out.txt"
    translate_stream(
        model, tokenizer, job(input=str(source), output=str(out), **overrides), torch.device("cpu"), "fp32", controls
    )
    return out.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("beam", [1, 5])
def test_translate_honours_prefixes_constraints_terms_and_avoid(model, tokenizer, tmp_path, beam):
    plain = translate_file(model, tokenizer, tmp_path, SENTENCES, decode={"beam": beam})
    prefixes = tmp_path / "prefix.txt"
    prefixes.write_text("A young\n\nThe woman\n\n", encoding="utf-8")
    terms = tmp_path / "terms.tsv"
    terms.write_text("Hund\tdog\nGitarre\tguitar\n", encoding="utf-8")
    # A word the model wrote that is one piece on its own (as the avoided phrase is tokenized).
    banned = next(w for line in plain for w in line.split() if len(tokenizer.encode_tgt(w)) == 1 and w.isalpha())
    avoid = tmp_path / "avoid.txt"
    avoid.write_text(banned + "\n", encoding="utf-8")
    lines = [SENTENCES[0] + "\tbuilding\tmen", SENTENCES[1], SENTENCES[2], SENTENCES[3]]
    controls = line_controls("ordered", str(terms), False, str(avoid))
    outputs = translate_file(model, tokenizer, tmp_path, lines, controls, prefix=str(prefixes), decode={"beam": beam})
    assert outputs[0].startswith("A young") and outputs[2].startswith("The woman")
    assert 0 < outputs[0].index("building") < outputs[0].index("men")  # in order
    assert "dog" in outputs[1].split() or "dog" in outputs[1]
    assert "guitar" in outputs[2]
    assert all(banned not in output.split() for output in outputs)


def test_constraint_mode_without_constraints_changes_nothing(model, tokenizer, tmp_path):
    plain = translate_file(model, tokenizer, tmp_path, SENTENCES)
    assert translate_file(model, tokenizer, tmp_path, SENTENCES, line_controls("unordered", None, False, None)) == plain


def test_a_short_prefix_file_is_named(model, tokenizer, tmp_path):
    prefixes = tmp_path / "prefix.txt"
    prefixes.write_text("A\n", encoding="utf-8")
    with pytest.raises(MtrainError, match=r"prefix=.*prefix.txt: ends after line 1"):
        translate_file(model, tokenizer, tmp_path, SENTENCES, prefix=str(prefixes))


def test_the_command_refuses_target_controls_it_cannot_honour(run_dir, tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("Ein Hund.\nEin Mann.\n", encoding="utf-8")
    prefixes = tmp_path / "prefix.txt"
    prefixes.write_text("A\n", encoding="utf-8")
    terms = tmp_path / "terms.tsv"
    terms.write_text("Hund dog\n", encoding="utf-8")
    cases = [
        (("constraints=ordered", "engine=ctranslate2"), "constraints=ordered: CTranslate2 has no lexical constraints"),
        ((f"terms={terms}", "decode.sampling=topk"), "lexical constraints need beam search"),
        ((f"prefix={prefixes}",), "prefix=" + str(prefixes) + ": 1 lines, input=" + str(source) + " has 2"),
        ((f"terms={terms}",), "line 1: expected `source term<TAB>target term`"),
        # MBR and reranking choose among their own candidates: not with controls, markup or alignments
        # (mtrain.decoding_rules: the words an HTTP request is refused with too).
        ((f"avoid={terms}", "decode.mbr.candidates=beam"), f"avoid={terms}: MBR decoding and n-best reranking"),
        (("format=xml", "decode.mbr.candidates=sample"), "format=xml: MBR decoding (decode.mbr) keeps no attention"),
        (("decode.alignment=true", "decode.mbr.candidates=beam"), ": MBR decoding (decode.mbr) keeps no attention"),
    ]
    for args, message in cases:
        result = mtrain("translate", f"run={run_dir}", f"input={source}", *args, cwd=tmp_path)
        stderr = result.stderr.decode()
        assert result.returncode == 2, stderr
        assert message in stderr and "Traceback" not in stderr


def test_prefixes_and_constraints_use_only_pieces_a_restricted_softmax_can_emit(tokenizer, data_dir, tmp_path):
    """model.output_vocab=target: German words in a prefix or constraint are segmented into
    the English side's pieces (the others have probability 0 and could never be written)."""
    with gzip.open(data_dir / "multi30k" / "train.en.gz", "rt", encoding="utf-8") as english:
        allowed = {i for _, line in zip(range(400), english, strict=False) for i in tokenizer.encode_tgt(line)}
    allowed |= {tokenizer.eos_id, tokenizer.unk_id}
    torch.manual_seed(0)
    restricted = build_model(
        ModelConfig(**MODEL, output_vocab="target"),
        tokenizer.src_vocab_size,
        tokenizer.tgt_vocab_size,
        tokenizer.pad_id,
        joint_vocab=tokenizer.joint,
    ).eval()
    restricted.restrict_output(sorted(allowed))
    prefix, constraint = "Eine Frau spielt", "Gitarre"
    assert not set(tokenizer.encode_tgt(prefix + " " + constraint)) <= allowed  # German pieces
    prefixes = tmp_path / "prefix.txt"
    prefixes.write_text(prefix + "\n", encoding="utf-8")
    controls = LineControls(tabbed_constraints=True)
    (output,) = translate_file(
        restricted, tokenizer, tmp_path, [SENTENCES[2] + "\t" + constraint], controls, prefix=str(prefixes)
    )
    assert output.startswith(prefix) and constraint in output
