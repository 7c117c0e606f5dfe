"""Bad input everywhere (issue 8): each gets a clear one-line MtrainError or a counted repair.

End to end through `prepare_data`, `load_checkpoint`/`load_run` and the config check, on a
small synthetic corpus; a few `mtrain` subprocesses check the CLI contract (one line on
stderr, exit status 2, no traceback). Covered elsewhere, not repeated here:
- reader-level repairs and messages (CRLF/BOM/NUL, invalid UTF-8 skip or fail, mismatched
  train files, corrupted .gz, a TSV line with a stray tab): tests/test_data_sources.py;
- a truncated checkpoint, a checkpoint that would run code: tests/test_checkpoint.py;
- resuming with an incompatible config, `model.d_modle=...` and `train.lr=fast` rejected by
  Hydra naming the key without a traceback: tests/test_fit.py;
- translate input that is a directory (library and command), over-long, CRLF and
  undecodable translate input: tests/test_translate.py; arbitrary bytes: tests/test_properties.py.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from mtrain.batches import prepare_data
from mtrain.checkpoint.files import load_checkpoint, load_run, save_checkpoint
from mtrain.cli.common import CONFIG_DIR
from mtrain.config import DataConfig, FitConfig, ModelConfig, Positions, TokenizerConfig, to_plain
from mtrain.config_checks import check_known_keys
from mtrain.errors import MtrainError
from mtrain.model import build_model
from mtrain.train.setup import check_eval_lengths
from tests.warm_process import run_mtrain

REPO = Path(__file__).resolve().parents[1]
WORDS = [
    "der",
    "die",
    "das",
    "ein",
    "Hund",
    "Katze",
    "läuft",
    "schnell",
    "über",
    "Straße",
    "the",
    "a",
    "dog",
    "cat",
    "runs",
    "fast",
    "over",
    "street",
]
TOKENIZER = TokenizerConfig(vocab_size=40)
TINY_MODEL = dict(encoder_layers=1, decoder_layers=1, d_model=16, heads=2, ffn_dim=32, max_positions=64)
LONG_LINE = "Hund " * 20_000  # 100,000 characters


def synthetic_pairs(count: int, seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    lengths = [rng.randint(2, 7) for _ in range(count)]
    return [(" ".join(rng.choices(WORDS[:10], k=n)), " ".join(rng.choices(WORDS[10:], k=n))) for n in lengths]


SPLITS = {"train": synthetic_pairs(150, 0), "val": synthetic_pairs(10, 1), "test": synthetic_pairs(10, 2)}


def write_corpus(directory: Path, splits=SPLITS, newline: str = "\n") -> Path:
    directory.mkdir(parents=True)
    for split, pairs in splits.items():
        for side, lang in enumerate(("de", "en")):
            text = "".join(pair[side] + newline for pair in pairs)
            (directory / f"{split}.{lang}").write_bytes(text.encode("utf-8"))
    return directory


def with_line(pairs, index: int, src=None, tgt=None):
    changed = list(pairs)
    old_src, old_tgt = changed[index]
    changed[index] = (old_src if src is None else src, old_tgt if tgt is None else tgt)
    return changed


def config(directory: Path, cache: Path, **overrides) -> DataConfig:
    cfg = DataConfig(local_dir=str(directory), cache_dir=str(cache), **overrides)
    cfg.splits.test = "test"
    cfg.clean.max_len_ratio = 100.0  # tiny vocabulary: the languages' token counts differ a lot
    return cfg


def prepare(directory: Path, cache: Path, **overrides):
    messages: list[str] = []
    prepared = prepare_data(config(directory, cache, **overrides), TOKENIZER, log=messages.append)
    summary = json.loads((prepared.directory / "summary.json").read_text(encoding="utf-8"))
    return prepared, summary, "\n".join(messages)


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert message and "\n" not in message and "Traceback" not in message
    return message


def same_train_arrays(a, b) -> bool:
    return all(
        np.array_equal(getattr(a.train, name), getattr(b.train, name))
        for name in ("src_tokens", "src_lengths", "tgt_tokens", "tgt_lengths")
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def clean(tmp_path_factory, cache):
    """The clean corpus, prepared: what each repaired corpus must come out as."""
    directory = write_corpus(tmp_path_factory.mktemp("corpora") / "clean")
    prepared, summary, _ = prepare(directory, cache)
    assert summary["train"]["filtered"] == {} and len(prepared.train) == 150
    return prepared


@pytest.fixture(scope="module")
def long_valid_line(tmp_path_factory) -> Path:
    """A corpus whose 3rd validation source is 100,000 characters long (shared with the CLI test)."""
    return write_corpus(
        tmp_path_factory.mktemp("corpora") / "long_valid", dict(SPLITS, val=with_line(SPLITS["val"], 2, src=LONG_LINE))
    )


# ------------------------------------------------------------------ corpora
def test_crlf_bom_and_nul_bytes_come_out_exactly_as_the_clean_corpus(tmp_path, cache, clean):
    directory = write_corpus(tmp_path / "dirty", newline="\r\n")
    for path in directory.iterdir():
        path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    for name, line in (("train.de", 0), ("train.en", 7), ("val.de", 3)):
        lines = (directory / name).read_bytes().split(b"\r\n")
        lines[line] = lines[line].replace(b" ", b" \x00", 1)
        (directory / name).write_bytes(b"\r\n".join(lines))
    prepared, _, log = prepare(directory, cache)
    vocabulary = range(clean.tokenizer.src_vocab_size)
    assert prepared.tokenizer.src_pieces(vocabulary) == clean.tokenizer.src_pieces(vocabulary)  # same text
    assert same_train_arrays(prepared, clean)
    assert prepared.valid_text == clean.valid_text and prepared.test_text == clean.test_text
    assert "data: train: removed NUL bytes from 2 lines" in log
    assert "data: valid: removed NUL bytes from 1 lines" in log


def test_invalid_utf8_pairs_are_skipped_counted_and_recorded(tmp_path, cache):
    directory = write_corpus(tmp_path / "d")
    for name in ("train.de", "val.en"):
        lines = (directory / name).read_bytes().split(b"\n")
        lines[4] = b"kaputt \xff\xfe " + lines[4]
        (directory / name).write_bytes(b"\n".join(lines))
    prepared, summary, log = prepare(directory, cache)
    assert summary["train"]["invalid_utf8"] == 1 and prepared.summary["directions"][0]["valid"]["invalid_utf8"] == 1
    assert len(prepared.train) == 149 and len(prepared.valid_text) == 9
    assert prepared.valid_text.src[4] == SPLITS["val"][5][0]  # the rest stays aligned
    assert "data: valid: skipped 1 pairs that are not valid UTF-8 (first at" in log and "val.en line 5" in log


def test_tabs_in_text_corpora_are_whitespace(tmp_path, cache, clean):
    tabbed = {
        split: [(src.replace(" ", "\t"), tgt.replace(" ", " \t ")) for src, tgt in pairs]
        for split, pairs in SPLITS.items()
    }
    prepared, _, _ = prepare(write_corpus(tmp_path / "tabs", tabbed), cache)
    assert same_train_arrays(prepared, clean)  # SentencePiece normalises a tab to a space
    assert prepared.valid_text.src[0] == tabbed["val"][0][0]  # references are scored as they are


def test_lines_of_100000_characters(tmp_path, cache, clean, long_valid_line):
    train = with_line(SPLITS["train"], 5, src=LONG_LINE, tgt=LONG_LINE)
    prepared, summary, log = prepare(write_corpus(tmp_path / "long_train", dict(SPLITS, train=train)), cache)
    assert summary["train"]["filtered"] == {"too_long": 1} and len(prepared.train) == 149
    assert "filtered (too_long 1)" in log

    # Validation and test pairs are never filtered: fit refuses them before training.
    prepared, _, _ = prepare(long_valid_line, cache)

    def fit_config(**model):
        return FitConfig(data=config(long_valid_line, cache), model=ModelConfig(**model))

    check_eval_lengths(prepared, fit_config(positions=Positions.none))  # no position table: any length embeds
    with pytest.raises(MtrainError) as error:
        check_eval_lengths(prepared, fit_config())
    assert re.match(
        r"data: pair 3 of the valid split \(data\.splits\.valid=val\) is \d+ subword tokens long "
        r"but the model embeds at most 1024 positions \(model\.max_positions\)",
        one_line(error),
    )

    # A run of several directions checks each one's sets, not only the first's, and names it.
    long_direction = dataclasses.replace(prepared.directions[0], src="fr", tgt="en")
    short_direction = dataclasses.replace(long_direction, src="de", valid=clean.valid, test=clean.test)
    two = dataclasses.replace(prepared, directions=[short_direction, long_direction])
    with pytest.raises(MtrainError) as error:
        check_eval_lengths(two, fit_config())
    assert one_line(error).startswith("data: pair 3 of the valid split of fr-en (data.splits.valid=val)")


def test_empty_line_on_one_side(tmp_path, cache):
    splits = dict(SPLITS, train=with_line(SPLITS["train"], 3, tgt=""), test=with_line(SPLITS["test"], 6, src=" "))
    prepared, summary, log = prepare(write_corpus(tmp_path / "d", splits), cache)
    assert summary["train"]["filtered"] == {"empty": 1} and "filtered (empty 1)" in log
    # A test pair is kept as it is: the empty source gets an empty hypothesis, scored as such.
    assert len(prepared.test_text) == 10 and prepared.test_text.src[6] == ""
    assert prepared.test_text.tgt[6] == SPLITS["test"][6][1] and prepared.test.src_lengths[6] == 1  # eos only


def test_mismatched_line_counts_in_a_test_split(tmp_path, cache):
    directory = write_corpus(tmp_path / "d")
    (directory / "test.en").write_text("".join(tgt + "\n" for _, tgt in SPLITS["test"][:-1]), encoding="utf-8")
    with pytest.raises(MtrainError) as error:
        prepare(directory, cache)
    assert "test.de has 10 lines but" in one_line(error) and "test.en has 9" in one_line(error)


# ------------------------------------------------------------------ checkpoints
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, clean) -> Path:
    """A run directory as `mtrain fit` leaves it: tokenizer/ and checkpoints/best.pt."""
    directory = tmp_path_factory.mktemp("run")
    clean.tokenizer.save(directory / "tokenizer")
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(**TINY_MODEL),
        clean.tokenizer.src_vocab_size,
        clean.tokenizer.tgt_vocab_size,
        clean.tokenizer.pad_id,
        joint_vocab=clean.tokenizer.joint,
    )
    config = to_plain(OmegaConf.structured(FitConfig(model=ModelConfig(**TINY_MODEL))))
    save_checkpoint(directory / "checkpoints" / "best.pt", {"model": model.state_dict(), "config": config, "update": 3})
    return directory


def changed_run(run_dir: Path, tmp_path: Path, change) -> Path:
    """A copy of `run_dir` whose checkpoint dict went through `change`."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    path = copy / "checkpoints" / "best.pt"
    state = torch.load(path, weights_only=True)
    change(state)
    save_checkpoint(path, state)
    return copy


def flip_a_weight_byte(path: Path) -> None:
    """Flip one byte inside the largest tensor's data, leaving the zip structure intact."""
    with zipfile.ZipFile(path) as archive:
        record = max((info for info in archive.infolist() if "/data/" in info.filename), key=lambda i: i.file_size)
    data = bytearray(path.read_bytes())
    name_and_extra = int.from_bytes(
        data[record.header_offset + 26 : record.header_offset + 28], "little"
    ) + int.from_bytes(data[record.header_offset + 28 : record.header_offset + 30], "little")
    data[record.header_offset + 30 + name_and_extra + record.file_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_flipped_bit_inside_a_tensor_is_caught(tmp_path, run_dir):
    path = tmp_path / "best.pt"
    shutil.copyfile(run_dir / "checkpoints" / "best.pt", path)
    flip_a_weight_byte(path)
    torch.load(path, weights_only=True)  # torch alone would hand back a silently different weight
    with pytest.raises(MtrainError) as error:
        load_checkpoint(path)
    assert "fails its CRC-32 check" in one_line(error)


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "not a loadable mtrain checkpoint"),
        (b"model: weights\n", "not a loadable mtrain checkpoint"),
        ([1, 2, 3], "not an mtrain checkpoint"),
        ({"model": [1, 2]}, "not an mtrain checkpoint"),
    ],
)
def test_empty_or_foreign_checkpoint_files_are_refused(tmp_path, content, expected):
    path = tmp_path / "c.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    with pytest.raises(MtrainError) as error:
        load_checkpoint(path)
    assert expected in one_line(error)


def _set_model_key(key, value):
    return lambda state: state["config"]["model"].__setitem__(key, value)


@pytest.mark.parametrize(
    "change, expected",
    [
        (_set_model_key("fancy_switch", True), "stored config key model.fancy_switch does not fit this mtrain version"),
        (_set_model_key("d_model", "big"), "stored config key model.d_model does not fit"),
        (
            _set_model_key("heads", 3),
            "model config stored in the checkpoint is invalid: model.heads: 3 does not divide",
        ),
        (_set_model_key("d_model", 32), "size mismatch for"),
        (lambda state: state.pop("config"), "the checkpoint holds no model config"),
    ],
    ids=["unknown key", "wrong type", "invalid value", "other shapes", "no config"],
)
def test_checkpoint_from_an_incompatible_config_is_refused(tmp_path, run_dir, change, expected):
    with pytest.raises(MtrainError) as error:
        load_run(changed_run(run_dir, tmp_path, change))
    assert expected in one_line(error)


def test_checkpoint_and_a_replaced_tokenizer_do_not_fit(tmp_path, run_dir):
    other_vocabulary = build_model(ModelConfig(**TINY_MODEL), 200, 200, 1, joint_vocab=True).state_dict()
    run = changed_run(run_dir, tmp_path, lambda state: state.__setitem__("model", other_vocabulary))
    with pytest.raises(MtrainError) as error:
        load_run(run)
    assert "size mismatch for" in one_line(error) and "tokenizer" in one_line(error)


def test_checkpoint_from_before_a_new_model_key_loads_with_its_default(tmp_path, run_dir):
    """The documented repair: a key added after the checkpoint was written takes its default."""
    run = changed_run(run_dir, tmp_path, lambda state: state["config"]["model"].pop("vocab_multiple"))
    loaded = load_run(run)
    assert loaded.config.model.vocab_multiple == ModelConfig().vocab_multiple and loaded.update == 3


# ------------------------------------------------------------------ config
def test_appended_unknown_config_key_is_refused():
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        check_known_keys(compose("fit", overrides=["experiment=multi30k_cpu"]))
        appended = compose("fit", overrides=["+model.d_modle=512"])  # `+` bypasses Hydra's own check
        translate = compose("translate", overrides=["+decode.beem=3"])
    with pytest.raises(MtrainError, match=r"^model\.d_modle: unknown config key \(not in ModelConfig\)"):
        check_known_keys(appended)
    with pytest.raises(MtrainError, match=r"^decode\.beem: unknown config key"):
        check_known_keys(translate)


# ------------------------------------------------------------------ the command line
def mtrain(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    return run_mtrain(*args, text=True, cwd=cwd, env=env, timeout=120)


def assert_one_line_error(result: subprocess.CompletedProcess, expected: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("mtrain: error:")]
    assert len(errors) == 1 and expected in errors[0], result.stderr[-2000:]


def test_fit_refuses_an_over_long_validation_line_before_training(tmp_path, cache, long_valid_line):
    result = mtrain(
        "fit",
        f"data.local_dir={long_valid_line}",
        f"data.cache_dir={cache}",
        "data.splits.test=test",
        "data.clean.max_len_ratio=100.0",
        f"tokenizer.vocab_size={TOKENIZER.vocab_size}",
        *(f"model.{key}={value}" for key, value in TINY_MODEL.items()),
        "train.num_threads=1",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert_one_line_error(result, "data: pair 3 of the valid split")
    run_dir = tmp_path / "run"
    assert not run_dir.exists()  # Hydra made it, and it is removed again: nothing was written


def test_an_unknown_config_name_is_one_line(tmp_path):
    result = mtrain("fit", "--config-name", "fitt", cwd=tmp_path)
    assert_one_line_error(result, "--config-name=fitt: no such config in")
    assert "(did you mean --config-name=fit?)" in result.stderr and "search path" not in result.stderr


def test_an_unquoted_non_ascii_path_says_that_quoting_works(tmp_path):
    run_dir = tmp_path / "rün"
    result = mtrain("translate", f"run={run_dir}", cwd=tmp_path)
    quoted_value = "run=\"'" + str(run_dir) + "'\""  # what the user types: run="'...'"
    assert_one_line_error(
        result,
        f"run: '{run_dir}' has a character ('\u00fc') that an override takes only quoted; "
        f"quote the value: {quoted_value}",
    )
    quoted = mtrain("translate", f"run='{run_dir}'", cwd=tmp_path)  # as the shell passes run="'...'"
    assert_one_line_error(quoted, f"run={run_dir}: no such run directory")


def test_translate_with_a_corrupted_checkpoint_or_an_appended_typo(tmp_path, run_dir):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    flip_a_weight_byte(run / "checkpoints" / "best.pt")
    (tmp_path / "in.txt").write_text("ein Hund\n", encoding="utf-8")
    result = mtrain("translate", f"run={run}", f"input={tmp_path / 'in.txt'}", cwd=tmp_path)
    assert_one_line_error(result, "fails its CRC-32 check")
    result = mtrain("translate", f"run={run}", "+decode.beem=3", cwd=tmp_path)
    assert_one_line_error(result, "decode.beem: unknown config key")


# ------------------------------------------------------------------ safety
BUILTINS_THAT_RUN_CODE = {"eval", "exec", "compile", "__import__"}
LOADERS_THAT_RUN_CODE = {
    ("pickle", "load"),
    ("pickle", "loads"),
    ("marshal", "loads"),
    ("dill", "load"),
    ("dill", "loads"),
    ("cloudpickle", "load"),
    ("joblib", "load"),
    ("yaml", "load"),
    ("yaml", "unsafe_load"),
    ("yaml", "full_load"),
}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def unsafe_calls(source: str, filename: str) -> list[str]:
    """Calls that could run code from a data, checkpoint or config file."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        if (
            isinstance(node, ast.ImportFrom)
            and node.module in ("torch", "pickle", "hydra.utils")
            and any(alias.name in ("load", "loads", "instantiate") for alias in node.names)
        ):
            found.append(f"{where}: from {node.module} import a loader")
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        keywords = {keyword.arg: keyword.value for keyword in node.keywords}
        if name == "torch.load":
            weights_only = keywords.get("weights_only")
            if not (isinstance(weights_only, ast.Constant) and weights_only.value is True):
                found.append(f"{where}: torch.load without weights_only=True")
        elif (
            name in BUILTINS_THAT_RUN_CODE
            or name.endswith("instantiate")
            or tuple(name.split(".")[-2:]) in LOADERS_THAT_RUN_CODE
        ):
            found.append(f"{where}: {name}(...)")
        for flag in ("trust_remote_code", "allow_pickle"):
            value = keywords.get(flag)
            if value is not None and not (isinstance(value, ast.Constant) and value.value is False):
                found.append(f"{where}: {flag}={ast.unparse(value)}")
    return found


def test_the_unsafe_call_check_notices_what_it_forbids():
    sample = (
        "import torch, pickle\ntorch.load(p)\ntorch.load(p, weights_only=False)\npickle.loads(b)\n"
        "eval(s)\nhydra.utils.instantiate(cfg)\ndatasets.load_dataset(x, trust_remote_code=True)\n"
        "torch.load(p, weights_only=True)\nre.compile(r'x')\nmodel.eval()\n"
    )
    assert len(unsafe_calls(sample, "sample.py")) == 6


def test_nothing_runs_code_from_checkpoints_data_or_configs():
    """Checkpoints load with torch.load(weights_only=True); no eval/exec/pickle of data; no
    hydra.utils.instantiate, and no config names a class (`_target_`) to build."""
    files = sorted((REPO / "mtrain").rglob("*.py")) + sorted((REPO / "scripts").rglob("*.py"))
    assert len(files) > 30
    found = [
        problem
        for path in files
        for problem in unsafe_calls(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    ]
    assert not found, "\n".join(found)
    assert not [p for p in (REPO / "configs").rglob("*.yaml") if "_target_" in p.read_text(encoding="utf-8")]
