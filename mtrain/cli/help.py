"""`mtrain COMMAND --help`: what the command does, its config groups and presets, every key.

Keys, types and defaults come from composing the command's config (with the overrides given
on the same command line, so `mtrain fit experiment=multi30k_cpu --help` shows that preset's
values); descriptions are the comments beside and above each field of the schema dataclasses
in mtrain/config/, read from their source. Neither torch nor the command's module is
imported, so help appears in well under a second. Hydra's own help stays at `--hydra-help`.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import io
import re
import shutil
import textwrap
import tokenize
import types
import typing
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

# What each command does and how it is typically called. Its config is configs/<config>.yaml;
# "hidden": keys of a shared section that the command never reads.
COMMAND_HELP: dict[str, dict[str, Any]] = {
    "fit": {
        "config": "fit",
        "about": "Train a SentencePiece tokenizer and a Transformer on a parallel corpus, validate with "
        "BLEU, checkpoint, and score the test set, all in one run directory (hydra.run.dir).",
        "examples": [
            "mtrain fit experiment=multi30k_cpu hydra.run.dir=runs/m30k",
            "mtrain fit experiment=multi30k_cpu train.max_time=2m hydra.run.dir=runs/smoke",
            "mtrain fit data=wmt14_en_de tokenizer=spm32k_bpe model=transformer_base",
            "mtrain fit -m model.dropout=0.1,0.3 experiment=multi30k_cpu     # a sweep",
            "mtrain fit experiment=multi30k_cpu hydra.run.dir=runs/m30k train.resume=true",
        ],
        # Training validates and tests with beam search: MBR and reranking are decode-time keys.
        "hidden": [
            *(f"decode.mbr.{key}" for key in ("*", "candidates", "num_candidates", "num_pseudo_refs", "utility")),
            *(f"decode.rerank.{key}" for key in ("*", "weights", "reverse_run", "second_run")),
        ],
    },
    "translate": {
        "config": "translate",
        "about": "Translate a file or stdin with a trained run (or an exported CTranslate2 model). "
        "Only translations go to stdout; logs go to stderr.",
        "examples": [
            "mtrain translate run=runs/m30k input=test.de output=test.hyp",
            "cat test.de | mtrain translate run=runs/m30k decode.beam=1 > test.hyp",
            "mtrain translate run=runs/m30k input=test.de decode.nbest=5     # n-best TSV",
            "mtrain translate run=runs/m30k_ct2 input=test.de     # an `mtrain export` directory: CTranslate2",
            "mtrain translate run=runs/m30k_multi tgt_lang=fr input=test.de     # a multilingual run",
            "mtrain translate run=runs/m30k input=test.de terms=glossary.tsv     # glossary terms must appear",
            "mtrain translate run=runs/m30k input=test.de prefix=test.prefix     # outputs start with these lines",
        ],
        "hidden": ["decode.valid_beam"],  # the beam of training's validation
    },
    "serve": {
        "config": "serve",
        "about": "Serve a run (or an exported CTranslate2 model) over HTTP: mtrain's JSON API "
        '(POST /translate {"text": [...]}, GET /health; docs/SERVE.md), LibreTranslate\'s API on the same '
        "port (POST /translate with q, source, target; GET /languages; its clients and plugins work: "
        "docs/LIBRETRANSLATE.md) and a page to translate in (GET /). Concurrent requests are decoded "
        "together in batches; it listens on 127.0.0.1 unless host= says otherwise (behind a reverse "
        "proxy, with TLS, as a service or in a container: docs/DEPLOY.md).",
        "examples": [
            "mtrain serve run=runs/m30k port=8080     # http://127.0.0.1:8080/ is the page",
            "mtrain serve run=runs/m30k_ct2 host=0.0.0.0     # an `mtrain export` directory: CTranslate2",
            "curl -s localhost:8080/translate -H 'Content-Type: application/json' -d '{\"text\": [\"Ein Hund.\"]}'",
            "curl -s localhost:8080/translate -d q='Ein Hund.' -d source=de -d target=en     # LibreTranslate's API",
        ],
        "hidden": ["decode.valid_beam"],
    },
    "eval": {
        "config": "eval",
        "about": "Score a run (decode its split, then sacreBLEU: BLEU, chrF, TER with signatures), "
        "a hypothesis file, or compare the runs of a sweep with paired bootstrap resampling.",
        "examples": [
            "mtrain eval run=runs/m30k split=test [average_last=3]",
            "mtrain eval hyp=test.hyp ref=test.en           (ref=[a.en,b.en] for several)",
            "mtrain eval runs=multirun/DATE/TIME baseline=0",
            "mtrain eval run=runs/m30k_multi src_lang=de tgt_lang=fr split=test   # a direction of a multilingual run",
        ],
        "hidden": ["decode.valid_beam"],
    },
    "prepare": {
        "config": "prepare",
        "about": "Train the tokenizer and encode the corpus into the cache, without training: takes "
        "the same overrides as `mtrain fit` (only data.* and tokenizer.* matter).",
        "examples": [
            "mtrain prepare data=wmt14_en_de tokenizer=spm32k_bpe data.num_workers=8",
        ],
    },
    "average": {
        "config": "average",
        "about": "Average the parameters of the last N checkpoints of a run (or of given files) into a new checkpoint.",
        "examples": [
            "mtrain average run=runs/m30k last=3",
            "mtrain average checkpoints=[a.pt,b.pt] out=avg.pt",
        ],
    },
    "report": {
        "config": "report",
        "arguments": " [SWEEP_DIR]",
        "about": "A Markdown table (with paired bootstrap against a baseline) and loss/BLEU plots "
        "for the runs of a sweep.",
        "examples": [
            "mtrain report multirun/DATE/TIME",
            "mtrain report sweep=runs/a,runs/b out=report/",
        ],
    },
    "export": {
        "config": "export",
        "about": "Convert a run for an inference engine: a CTranslate2 model directory for fast CPU/GPU "
        "inference (format=ctranslate2, the default; translate, eval and serve decode it as run=), an "
        "Argos Translate package for Argos Translate and LibreTranslate (format=argos, out=FILE.argosmodel), "
        "or a Hugging Face transformers model directory (format=hf: AutoModelForSeq2SeqLM and "
        "AutoTokenizer load it). docs/EXPORT.md.",
        "examples": [
            "mtrain export run=runs/m30k format=ctranslate2 out=runs/m30k_ct2 quantization=int8",
            "mtrain export run=runs/m30k format=argos out=runs/de_en.argosmodel quantization=int8",
            "mtrain export run=runs/m30k format=hf out=runs/m30k_hf",
        ],
    },
}


def command_help(command: str, overrides: Sequence[str] = ()) -> str:
    """The help text of `command`, with the values `overrides` give."""
    from mtrain.cli.common import CONFIG_DIR

    spec = COMMAND_HELP[command]
    config_dir = Path(CONFIG_DIR)
    cfg, note = _compose(command, spec["config"], config_dir, list(overrides))
    width = min(shutil.get_terminal_size((100, 24)).columns, 120)
    groups = _groups(config_dir, spec["config"], overrides)
    arguments = spec.get("arguments", "") + (" [GROUP=PRESET ...]" if groups else "")
    out = [f"usage: mtrain {command}{arguments} [KEY=VALUE ...] [-m] [--cfg job] [--hydra-help]", ""]
    out += textwrap.wrap(spec["about"], width)
    if note:
        out += ["", note]
    if groups:
        out += ["", "config groups (GROUP=PRESET picks a preset; configs/GROUP/PRESET.yaml):"]
        for group, chosen in groups:
            out.append(f"  {group}  (now: {chosen or 'none'})")
            for preset, about in _presets(config_dir / group):
                out.append(_clip(f"    {preset:<28} {about}".rstrip(), width))
    out += ["", "keys (KEY=VALUE overrides one; `null` unsets an optional key):"]
    out += _key_lines(cfg, width, spec.get("hidden", ()))
    out += ["", "examples:"] + [f"  {example}" for example in spec["examples"]]
    out += [
        "",
        "`--cfg job` prints the composed config (then the refusal, exit 2, if the command would refuse it);",
        "`--hydra-help` shows Hydra's own options.",
    ]
    return "\n".join(out)


def _compose(command: str, config_name: str, config_dir: Path, overrides: list[str]) -> tuple[Any, str]:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        if overrides:
            try:
                return compose(config_name, overrides=overrides), ""
            except Exception as error:  # the help is still useful with the plain defaults
                first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                return compose(config_name), f"(defaults shown: the overrides do not compose: {first_line})"
        return compose(config_name), ""


def _groups(config_dir: Path, config_name: str, overrides: Sequence[str]) -> list[tuple[str, str | None]]:
    """(group, chosen preset) for each group in the command's defaults list."""
    from omegaconf import OmegaConf

    primary = OmegaConf.to_container(OmegaConf.load(config_dir / f"{config_name}.yaml"))
    assert isinstance(primary, dict)  # a primary config file is a mapping
    defaults = primary.get("defaults", [])
    chosen = dict(
        override.split("=", 1) for override in overrides if "=" in override and "." not in override.split("=")[0]
    )
    groups = []
    for entry in defaults:
        if not isinstance(entry, dict):
            continue  # the schema and _self_
        ((group, preset),) = entry.items()
        if group.startswith("override ") or not (config_dir / group).is_dir():
            continue  # Hydra's own groups (hydra/job_logging)
        groups.append((group, chosen.get(group, preset)))
    return groups


def _presets(group_dir: Path) -> list[tuple[str, str]]:
    """Each preset's name and the first line of its leading comment."""
    presets = []
    for path in sorted(group_dir.glob("*.yaml")):
        about = ""
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("# @package"):
                continue
            if line.startswith("#"):
                about = line.lstrip("# ").strip()
            break
        presets.append((path.stem, about))
    return presets


def _key_lines(cfg: Any, width: int, hidden: Sequence[str] = ()) -> list[str]:
    """One line per key (`name  type = default  description`), but the `hidden` ones; a
    description too long for the rest of the line goes on the lines below it."""
    rows = [row for row in _rows(cfg, "") if row[0] not in hidden]
    name_width = max(len(name) for name, *_ in rows)
    kind_width = min(max(len(f"{kind} = {value}") for _, kind, value, _ in rows), 30)
    lines = []
    for name, kind, value, about in rows:
        if not kind:  # a section heading
            lines.append(_clip(f"  {name}  {about}".rstrip(), width))
            continue
        head = f"    {name:<{name_width}}  {f'{kind} = {value}':<{kind_width}}"
        if about and len(head) + 2 + len(about) <= width:
            lines.append(f"{head}  {about}")
            continue
        lines.append(head.rstrip())
        lines += textwrap.wrap(about, width, initial_indent=" " * 8, subsequent_indent=" " * 8)
    return lines


def _rows(cfg: Any, prefix: str):
    """(key, type, value, description) for every key of `cfg`, nested sections after plain keys."""
    from omegaconf import OmegaConf

    schema: type | None = OmegaConf.get_type(cfg)  # (`type`, not type[Any]: lru_cache hashes it)
    fields = {field.name: field for field in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else {}
    hints = typing.get_type_hints(schema) if fields else {}
    notes = inherited_descriptions(schema) if fields and schema is not None else {}
    values = OmegaConf.to_container(cfg, resolve=False)  # as written: `${...}` and `???` shown, not resolved
    assert isinstance(values, dict)  # `cfg` is a section
    sections = []
    for key in cfg:
        if dataclasses.is_dataclass(OmegaConf.get_type(cfg, key)):
            sections.append(key)
            continue
        kind = _type_name(hints[key]) if key in hints else "any"
        yield f"{prefix}{key}", kind, _value_text(values[key]), notes.get(key, "")
    for key in sections:
        section_schema = OmegaConf.get_type(cfg, key)
        assert section_schema is not None  # a dataclass (above)
        yield f"{prefix}{key}.*", "", "", _docstring(section_schema)
        yield from _rows(cfg[key], f"{prefix}{key}.")


def _docstring(schema: type) -> str:
    """The first paragraph of a schema's docstring, on one line ("" for none: a dataclass
    without one gets its signature as __doc__)."""
    doc = inspect.getdoc(schema) or ""
    if doc.startswith(f"{schema.__name__}("):
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):  # Optional[int] and int | None
        names = [_type_name(arg) for arg in args if arg is not type(None)]
        return "|".join(names) + ("|null" if type(None) in args else "")
    if origin is list:
        return f"list[{_type_name(args[0])}]" if args else "list"
    if origin is dict:
        return "dict"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "|".join(member.name for member in hint)
    return getattr(hint, "__name__", str(hint))


def _value_text(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


def inherited_descriptions(schema: type) -> dict[str, str]:
    """`field_descriptions` of a schema and of the config dataclasses it extends (the keys the
    decoding commands share: mtrain.config.DecodingCommandConfig)."""
    descriptions: dict[str, str] = {}
    for cls in reversed(schema.__mro__):
        if dataclasses.is_dataclass(cls):
            descriptions.update(field_descriptions(cls))
    return descriptions


@cache
def field_descriptions(schema: type) -> dict[str, str]:
    """Field name -> its comment in the dataclass source: the full-line comments right above
    the field, then the comment at the end of its line, joined into one line."""
    try:
        source = textwrap.dedent(inspect.getsource(schema))
    except (OSError, TypeError):  # installed without its .py sources: no descriptions
        return {}
    comments: dict[int, tuple[str, bool]] = {}  # line -> (text, whole line)
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            whole_line = not lines[row - 1][:col].strip()
            comments[row] = (token.string.lstrip("#").strip(), whole_line)
    descriptions = {}
    for row, line in enumerate(lines, start=1):
        match = re.match(r"    (\w+)\s*:", line)
        if not match:
            continue
        above: list[str] = []
        previous = row - 1
        while previous in comments and comments[previous][1]:
            above.insert(0, comments[previous][0])
            previous -= 1
        trailing = [comments[row][0]] if row in comments and not comments[row][1] else []
        text = " ".join(above + trailing)
        if text:
            descriptions[match.group(1)] = text
    return descriptions


def _clip(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 3].rstrip() + "..."
