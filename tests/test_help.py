"""`mtrain COMMAND --help` (mtrain.cli.help) and `mtrain --version` (mtrain.cli.main)."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import mtrain as mtrain_package
from mtrain.cli.help import command_help, field_descriptions


def mtrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtrain", *args], capture_output=True, text=True, timeout=120)


def key_line(text: str, key: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith(f"{key} "))


def test_fit_help_lists_groups_presets_and_every_key_with_type_default_and_description():
    result = mtrain("fit", "--help")
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.startswith("usage: mtrain fit")
    assert "powered by Hydra" not in text and "_schema" not in text
    assert "model  (now: transformer_small)" in text and "transformer_big" in text and "multi30k_cpu" in text
    lines = text.splitlines()
    at = next(index for index, line in enumerate(lines) if line.strip().startswith("model.layers "))
    assert "int|null = null" in lines[at] and "sets both stacks" in " ".join(lines[at : at + 2])  # beside or below
    assert "data.clean.max_len_ratio" in text and "train.betas" in text and "list[float] = [0.9, 0.98]" in text
    assert "examples:" in text and "--hydra-help" in text


def test_help_shows_the_values_the_overrides_give():
    text = command_help("fit", ["experiment=multi30k_cpu", "model.d_model=64"])
    assert "experiment  (now: multi30k_cpu)" in text
    assert key_line(text, "train.max_time").split()[1:4] == ["str|null", "=", "25m"]
    assert key_line(text, "train.max_train_time").split()[1:4] == ["str|null", "=", "20m"]
    assert key_line(text, "model.d_model").split()[1:4] == ["int", "=", "64"]


def test_translate_help_lists_only_translate_keys():
    text = command_help("translate")
    # a key's line starts 4 spaces in; its wrapped note, further in
    keys = [line.split()[0] for line in text.split("keys (")[1].splitlines()[1:] if re.match(r"    \S", line)]
    assert {"run", "input", "output", "engine", "decode.beam"} <= set(keys)
    assert not [key for key in keys if key.split(".")[0] in ("model", "train", "data", "tokenizer", "experiment")]
    assert "experiment" not in text
    assert "decode.valid_beam" not in text  # a key of training's validation
    assert "decode.valid_beam" not in command_help("eval")
    assert "decode.valid_beam" in command_help("fit")


def test_help_imports_neither_torch_nor_the_command():
    probe = (
        "import sys; from mtrain.cli.help import command_help; command_help('fit'); command_help('export'); "
        "print(sorted(m for m in sys.modules if m == 'torch' or m == 'mtrain.cli.fit'))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@dataclass
class Example:
    plain: int = 1
    # What the block above a field says,
    # on two lines.
    described: str | None = "a # inside a string"  # and its own comment
    trailing: float = 0.5  # only a trailing comment


def test_field_descriptions_join_the_comments_above_and_beside_a_field():
    assert field_descriptions(Example) == {
        "described": "What the block above a field says, on two lines. and its own comment",
        "trailing": "only a trailing comment",
    }


def test_hydra_help_stays_reachable():
    result = mtrain("average", "--hydra-help")
    assert result.returncode == 0 and "Hydra" in result.stdout


def test_version_prints_the_installed_version():
    for flag in ("--version", "-V"):
        result = mtrain(flag)
        assert result.returncode == 0 and result.stdout == f"mtrain {version('mtrain')}\n"


def prose(text: str) -> str:
    """A command's help without its key lines (whose types list an enum's values by themselves)."""
    head, _, rest = text.partition("\nkeys (")
    return head + rest.partition("\nexamples:")[2]


def served_paths() -> set[str]:
    """The HTTP paths `mtrain serve` routes, read from the package's route decorators
    (`@app.get("/health")`, `@router.post(...)`), wherever the server's modules live."""
    import ast

    paths = set()
    for source in Path(mtrain_package.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    if (
                        isinstance(decorator, ast.Call)
                        and isinstance(decorator.func, ast.Attribute)
                        and decorator.func.attr in ("get", "post", "put", "delete")
                        and decorator.args
                        and isinstance(decorator.args[0], ast.Constant)
                        and str(decorator.args[0].value).startswith("/")
                    ):
                        paths.add(decorator.args[0].value)
    return paths


def test_every_help_names_every_format_and_api_the_command_has():
    """What a command offers is named where a newcomer looks first (`mtrain --help`, the
    command's `--help` beyond its key lines): every export format, the markup formats, every
    HTTP path of the server and LibreTranslate's API. The lists come from the code."""
    from mtrain.cli.main import usage
    from mtrain.config import ExportFormat
    from mtrain.decode.requests.markup import FORMATS

    export_line = next(line for line in usage().splitlines() if line.split()[:1] == ["export"])
    export = prose(command_help("export"))
    for fmt in ExportFormat:
        assert f"format={fmt.value}" in export, f"export --help does not name format={fmt.value}"
        assert fmt.value in export_line, f"mtrain --help's export line does not name {fmt.value}"
    # quantization is CTranslate2's, so an Argos package (a CTranslate2 model inside) takes it too
    quantization = command_help("export").split("quantization ")[1].split("\n    force")[0]
    assert "argos" in quantization and "ctranslate2 only" not in quantization
    translate = command_help("translate")
    assert all(fmt in translate for fmt in FORMATS)
    serve = prose(command_help("serve"))
    paths = served_paths()
    assert {"/translate", "/health", "/languages", "/"} <= paths  # the scan finds the routes
    for path in paths:
        assert f" {path}" in serve, f"serve --help does not name {path}"
    libretranslate = [p for p in Path(mtrain_package.__file__).parent.rglob("*.py") if "libretranslate" in p.name]
    if libretranslate:
        assert "LibreTranslate's API" in serve and "docs/LIBRETRANSLATE.md" in serve
        assert "LibreTranslate" in next(line for line in usage().splitlines() if line.split()[:1] == ["serve"])
