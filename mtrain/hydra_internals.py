"""The one door to Hydra's private API: what mtrain needs from Hydra that Hydra keeps to itself.

mtrain checks a command line before Hydra runs it (mtrain.cli.common): it reads the command
line as Hydra's own parser does, composes every job as Hydra will (a `-m` sweep's jobs
included), and turns Hydra's composition errors into one line naming the key; Hydra is then
told the `hydra.mode` that composition found, instead of composing the config again to read it.
Hydra offers no public API for any of these, so this module uses `hydra._internal` and reads Hydra's
and OmegaConf's error texts with regular expressions; nothing else in mtrain does.
pyproject.toml bounds hydra-core and omegaconf to the versions this was written for, and
tests/test_hydra_internals.py fails when a new version composes, parses or words its errors
differently.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:  # Hydra's private API, imported where it is used
    from hydra._internal.config_repository import ConfigRepository

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


@dataclass(frozen=True)
class CommandLine:
    """A command line as Hydra's own argument parser reads it."""

    overrides: list[str]
    multirun: bool  # -m / --multirun
    prints_config: bool  # --cfg job|hydra|all: Hydra prints the config and runs nothing
    # A flag that composes nothing of ours (--help, --hydra-help, --info, --shell-completion)
    # or takes the config from elsewhere (--config-name/-path/-dir, --experimental-rerun).
    hydra_only: bool
    # --config-name NAME without --config-path/--config-dir: a primary config of ours (`has_primary_config`)
    config_name: str | None = None
    printed_part: str | None = None  # what --cfg prints: job, hydra or all


def read_command_line(argv: Sequence[str]) -> CommandLine:
    """`argv` (without the program name) parsed by Hydra's parser (`hydra._internal.utils`)."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(list(argv))
    hydra_only = bool(
        args.help
        or args.hydra_help
        or args.info
        or args.shell_completion
        or args.config_name
        or args.config_path
        or args.config_dir
        or args.experimental_rerun
    )
    ours = args.config_name if args.config_name and not (args.config_path or args.config_dir) else None
    return CommandLine(list(args.overrides), bool(args.multirun), args.cfg is not None, hydra_only, ours, args.cfg)


def primary_configs(config_dir: str) -> list[str]:
    """The names `--config-name` may take with `config_dir` (the commands' configs; the
    schemas Hydra's ConfigStore holds are left out)."""
    return [
        name
        for name in _repository(config_dir).get_group_options("")
        if not name.endswith("_schema") and not name.startswith("_")
    ]


def has_primary_config(config_dir: str, config_name: str) -> bool:
    """Whether Hydra finds `--config-name config_name` (a file of `config_dir`, with or
    without .yaml, or a schema of the ConfigStore)."""
    return _repository(config_dir).config_exists(config_name)


def _repository(config_dir: str) -> ConfigRepository:
    from hydra._internal.config_repository import ConfigRepository
    from hydra._internal.utils import create_automatic_config_search_path

    return ConfigRepository(create_automatic_config_search_path(None, None, config_dir))


def compose_jobs(
    config_dir: str, config_name: str, overrides: Sequence[str], multirun: bool
) -> list[tuple[str, DictConfig]]:
    """(label, config with its `hydra` section) of each job the command line runs, composed by
    Hydra's own loader: one unlabelled job for a run; for a sweep, the sweep's base config
    (unlabelled) and every job of Hydra's basic sweeper, labelled with its overrides (a sweep
    with another sweeper plugin: the base config only).

    Raises what Hydra raises for an override it cannot apply (see `read_composition_error`).
    """
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    search_path = create_automatic_config_search_path(None, None, config_dir)
    composer = Hydra.create_main_hydra2(task_name=config_name, config_search_path=search_path)
    try:

        def compose(job_overrides: list[str], mode: RunMode) -> DictConfig:
            cfg = composer.compose_config(
                config_name, job_overrides, run_mode=mode, from_shell=True, with_log_configuration=False
            )
            HydraConfig.instance().set_config(cfg)  # for ${hydra:...} in hydra.run.dir
            return cfg

        if not multirun:
            return [("", compose(list(overrides), RunMode.RUN))]
        base = compose(list(overrides), RunMode.MULTIRUN)
        jobs = [("", base)]
        if OmegaConf.select(base, "hydra.sweeper._target_") == BASIC_SWEEPER:
            params = [f"{key}={value}" for key, value in (base.hydra.sweeper.params or {}).items()]
            parsed = OverridesParser.create().parse_overrides(params + list(overrides))
            for batch in BasicSweeper.split_arguments(parsed, None):
                jobs += [(" ".join(job), compose(list(job), RunMode.RUN)) for job in batch]
        return jobs
    finally:
        GlobalHydra.instance().clear()


# hydra.mode of the command lines checked in this process: (config name, overrides) -> mode.
_checked_modes: dict[tuple[str, tuple[str, ...]], object] = {}


def tell_hydra_the_mode(config_name: str, overrides: Sequence[str], mode: object) -> None:
    """Before a run Hydra composes the whole config once more only to read `hydra.mode` from it
    (Hydra.get_mode: a third of a command's composing, ~0.3 s of its start). mtrain's check has
    just composed the same command line, so Hydra is given that `mode` for these exact overrides
    once; any other call composes as Hydra does. (The mode is the config's value, the same
    whichever run mode it is composed in: tests/test_hydra_internals.py.)"""
    from hydra._internal.hydra import Hydra

    _checked_modes[(config_name, tuple(overrides))] = mode
    if getattr(Hydra.get_mode, "__wrapped__", None) is not None:
        return
    hydras_get_mode = Hydra.get_mode

    def get_mode(self: Hydra, config_name: str | None, overrides: list[str]) -> object:
        checked = _checked_modes.pop((config_name or "", tuple(overrides)), _NOT_CHECKED)
        return hydras_get_mode(self, config_name, overrides) if checked is _NOT_CHECKED else checked

    get_mode.__wrapped__ = hydras_get_mode  # type: ignore[attr-defined]
    Hydra.get_mode = get_mode  # type: ignore[method-assign]


_NOT_CHECKED = object()


class ErrorKind(Enum):
    """What a composition error is about."""

    MISSING_PRESET = "missing_preset"  # group=name with no configs/<group>/<name>.yaml
    NOT_AN_OVERRIDE = "not_an_override"  # no key=value
    NEEDS_QUOTES = "needs_quotes"  # key=value whose value has a character the grammar reads only quoted (ü, ;)
    SEVERAL_VALUES = "several_values"  # key=a,b without -m
    UNKNOWN_KEY = "unknown_key"  # a key the schema does not have
    NOT_A_CHOICE = "not_a_choice"  # a value outside an Enum's members
    NOT_CONVERTIBLE = "not_convertible"  # a value of the wrong type (lr=fast)
    OTHER_VALUE = "other_value"  # another OmegaConf error about one key
    UNREAD = "unread"  # none of the above: `detail` is Hydra's first line


@dataclass(frozen=True)
class CompositionError:
    """The facts of a composition error, read from Hydra's and OmegaConf's error texts."""

    kind: ErrorKind
    detail: str  # Hydra's first line (UNREAD), the override's parse error, OmegaConf's reason, or
    # the character that needs quotes (NEEDS_QUOTES; "" where the caret could not be read)
    key: str = ""  # the config key (the group for MISSING_PRESET; the override for NOT_AN_OVERRIDE)
    value: str = ""  # the value given (the preset's name for MISSING_PRESET)
    allowed: tuple[str, ...] = ()  # the group's presets, or the choice's values


def read_composition_error(error: Exception) -> CompositionError:
    """What `error`, raised by `compose_jobs` (or Hydra's `compose`), says, as facts."""
    from hydra.errors import MissingConfigException, OverrideParseException

    text = str(error)
    lines = text.splitlines()
    first = lines[0] if lines else type(error).__name__
    if isinstance(error, MissingConfigException):
        found = re.search(r"Could not find '([^']+)/([^']+)'", text)
        if found is None:
            return CompositionError(ErrorKind.UNREAD, first)
        group, name = found.groups()
        return CompositionError(ErrorKind.MISSING_PRESET, first, group, name, tuple(error.options or ()))
    if isinstance(error, OverrideParseException):
        # The lexer names the whole override and puts a caret under the character it stopped at.
        lexer = re.match(r"(LexerNoViableAltException: )(.*)", first)
        if lexer and "=" in lexer.group(2):
            override = lexer.group(2)
            key, _, value = override.partition("=")
            column = lines[1].find("^") - len(lexer.group(1)) if len(lines) > 1 else -1
            character = override[column] if 0 <= column < len(override) else ""
            return CompositionError(ErrorKind.NEEDS_QUOTES, character, key, value)
        if lexer:
            return CompositionError(
                ErrorKind.NOT_AN_OVERRIDE, "a character outside Hydra's override grammar", lexer.group(2)
            )
        found = re.match(r"Error parsing override '(.*)'", first)
        return CompositionError(
            ErrorKind.NOT_AN_OVERRIDE, lines[1] if len(lines) > 1 else "", found.group(1) if found else first
        )
    ambiguous = re.match(r"Ambiguous value for argument '([^=]+)=(.*)'", first)
    if ambiguous:
        key, value = ambiguous.groups()
        return CompositionError(ErrorKind.SEVERAL_VALUES, first, key, value)
    cause = error.__cause__
    full_key: str | None = getattr(cause, "full_key", None)
    if not full_key:
        return CompositionError(ErrorKind.UNREAD, first)
    reason = str(cause).splitlines()[0]
    unknown = re.match(r"Could not override '([^']+)'", first)
    if unknown:
        key = unknown.group(1)
        if full_key != key and not full_key.startswith(f"{key}."):  # a key inside the value: a=[{nmae: x}]
            key = _key_inside_value(key, full_key, text)
        return CompositionError(ErrorKind.UNKNOWN_KEY, reason, key)
    choices = re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", reason)
    if choices:
        return CompositionError(
            ErrorKind.NOT_A_CHOICE, reason, full_key, choices.group(1), tuple(choices.group(2).split(", "))
        )
    converted = re.match(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", reason)
    if converted:
        # `allowed` holds the one type the value should have had (Float, Integer, Boolean...).
        return CompositionError(ErrorKind.NOT_CONVERTIBLE, reason, full_key, converted.group(1), (converted.group(2),))
    return CompositionError(ErrorKind.OTHER_VALUE, reason, full_key)


def _key_inside_value(key: str, inner: str, text: str) -> str:
    """The full key of an unknown key `inner` inside the value of override `key` (OmegaConf
    names it relative to the list item or mapping that holds it): `data.corpora[0].nmae` for
    `data.corpora=[{nmae: x}]`. Hydra's message repeats the override (\"use +KEY=VALUE\"),
    whose value its own parser reads back; `key` alone when that fails."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    found = re.search(rf"use \+{re.escape(key)}=(.*)$", text, re.MULTILINE)
    if found is None:
        return key
    try:
        value = OverridesParser.create().parse_overrides([f"{key}={found.group(1)}"])[0].value()
    except Exception:
        return key

    def holds(item: object, path: list[str]) -> bool:
        for name in path:
            if not isinstance(item, dict) or name not in item:
                return False
            item = item[name]
        return True

    path = inner.split(".")
    if isinstance(value, list):
        index = next((i for i, item in enumerate(value) if holds(item, path)), None)
        return f"{key}[{index}].{inner}" if index is not None else key
    return f"{key}.{inner}" if holds(value, path) else key
