"""What every Hydra app of mtrain shares: the config directory, the checks before a run,
and error handling.

`mtrain_app(config_name)` turns a task function into a command's `main()`. Before Hydra
runs the task (and so before it makes the run directory or writes `.hydra/`), `main()`
composes the config the same way Hydra will and refuses, in one line
`mtrain: error: <key>: <why>` with exit status 2, an override Hydra cannot apply (a misspelt
key, a wrong type, an unknown preset: with a "did you mean") and every bad value
(mtrain.config_checks), for each job of a `-m` sweep too. `HYDRA_FULL_ERROR=1` shows
Hydra's own error and stack trace instead.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any, Callable, List, Optional, Tuple

import hydra
from omegaconf import DictConfig, OmegaConf

from mtrain.config import APP_SCHEMAS, register_configs
from mtrain.config_checks import check_config, check_writable_dir, did_you_mean, schema_keys
from mtrain.errors import MtrainError


def find_config_dir(package: Path = Path(__file__).resolve().parents[1]) -> Path:
    """mtrain/configs/ in an installed wheel (pyproject.toml maps configs/ there), else
    configs/ at the top of the checkout (`pip install -e .` or PYTHONPATH=checkout)."""
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


CONFIG_DIR = str(find_config_dir())

register_configs()

log = logging.getLogger("mtrain")


def mtrain_app(config_name: str) -> Callable[[Callable[[DictConfig], Any]], Callable[..., Any]]:
    """Decorate `task(cfg)` into the `main()` of the command whose config is configs/<config_name>.yaml:
    checks before the run (see the module docstring), then Hydra, then `task` with MtrainError
    as one line. `main(cfg)` runs `task` on a given config (as Hydra's `cfg_passthrough`)."""

    def decorate(task: Callable[[DictConfig], Any]) -> Callable[..., Any]:
        app = hydra.main(config_path=CONFIG_DIR, config_name=config_name, version_base="1.3")(
            user_errors_as_messages(task))

        @functools.wraps(task)
        def main(cfg_passthrough: Optional[DictConfig] = None) -> Any:
            if cfg_passthrough is None:
                check_before_run(config_name, sys.argv[1:])
            return app(cfg_passthrough)

        return main

    return decorate


def user_errors_as_messages(app: Callable[..., Any]) -> Callable[..., Any]:
    """Check the config, run `app`; an MtrainError becomes one line on stderr and exit status 2.

    In a multirun sweep the failing job is reported and the sweep goes on: one diverged
    ablation must not cancel the others.
    """

    @functools.wraps(app)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            if args:
                check_config(args[0])
            return app(*args, **kwargs)
        except MtrainError as error:
            print(f"mtrain: error: {error}", file=sys.stderr)
            if _in_multirun():
                log.error("job failed: %s", error)
                return None
            sys.exit(getattr(error, "exit_status", 2))  # a stop signal exits 128 + its number

    return wrapper


def check_before_run(config_name: str, argv: List[str]) -> None:
    """Compose `config_name` with the command line `argv` as Hydra will and check every job's
    config; on a problem print one `mtrain: error:` line and exit with status 2.

    Hydra's own flags that compose nothing of ours (--help, --info, ...) or change where the
    config comes from (--config-name/-path/-dir) are left to Hydra.
    """
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(argv)
    if (args.help or args.hydra_help or args.info or args.shell_completion or args.config_name
            or args.config_path or args.config_dir or args.experimental_rerun):
        return
    try:
        for job, cfg in _composed_jobs(config_name, args.overrides, args.multirun):
            if args.cfg is not None:
                return  # --cfg prints the config: composing it is the check
            try:
                _check_job(cfg, args.multirun)
            except MtrainError as error:
                raise MtrainError(f"{error} (sweep job {job})" if job else str(error)) from error
    except MtrainError as error:
        _exit_with(str(error))
    except Exception as error:  # Hydra's composition errors and the OmegaConf errors they wrap
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        _exit_with(composition_error_message(error, config_name))


def _check_job(cfg: DictConfig, multirun: bool) -> None:
    from omegaconf import open_dict

    with open_dict(cfg):
        task = cfg.copy()
        del task["hydra"]
    check_config(task)
    # Hydra makes the job's directory and opens its log there before the task runs.
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    directory = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
    if directory is not None:
        check_writable_dir(Path(str(directory)), key)


def _composed_jobs(config_name: str, overrides: List[str], multirun: bool) -> List[Tuple[str, DictConfig]]:
    """(label, config) of each job the command line runs: one for a run; for a sweep, every
    job of Hydra's basic sweeper, labelled with its overrides. Hydra's internals are used
    here only, so that the composition is Hydra's own."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    search_path = create_automatic_config_search_path(None, None, CONFIG_DIR)
    composer = Hydra.create_main_hydra2(task_name=config_name, config_search_path=search_path)
    try:
        def compose(job_overrides: List[str], mode: RunMode) -> DictConfig:
            cfg = composer.compose_config(config_name, job_overrides, run_mode=mode, from_shell=True,
                                          with_log_configuration=False)
            HydraConfig.instance().set_config(cfg)  # for ${hydra:...} in hydra.run.dir
            return cfg

        if not multirun:
            return [("", compose(overrides, RunMode.RUN))]
        base = compose(overrides, RunMode.MULTIRUN)
        jobs = [("", base)]
        if OmegaConf.select(base, "hydra.sweeper._target_") == "hydra._internal.core_plugins.basic_sweeper.BasicSweeper":
            params = [f"{key}={value}" for key, value in (base.hydra.sweeper.params or {}).items()]
            parsed = OverridesParser.create().parse_overrides(params + list(overrides))
            for batch in BasicSweeper.split_arguments(parsed, None):
                jobs += [(" ".join(job), compose(list(job), RunMode.RUN)) for job in batch]
        return jobs
    finally:
        GlobalHydra.instance().clear()


def composition_error_message(error: Exception, config_name: str) -> str:
    """One line `<key>: <why>[ (did you mean ...?)]` for an error Hydra raised while composing."""
    from hydra.errors import MissingConfigException, OverrideParseException

    text = str(error)
    first = text.splitlines()[0] if text else type(error).__name__
    if isinstance(error, MissingConfigException):
        found = re.search(r"Could not find '([^']+)/([^']+)'", text)
        if found is None:
            return first
        group, name = found.groups()
        options = [option for option in (error.options or []) if not option.endswith("_schema")]
        return (f"{group}: no preset named '{name}' (the presets: {', '.join(options)})"
                + did_you_mean(name, options, f"{group}="))
    if isinstance(error, OverrideParseException):
        found = re.match(r"Error parsing override '(.*)'", first)
        detail = text.splitlines()[1] if len(text.splitlines()) > 1 else ""
        return f"{found.group(1) if found else first}: not an override of the form key=value ({detail})"
    ambiguous = re.match(r"Ambiguous value for argument '([^=]+)=(.*)'", first)
    if ambiguous:
        key, value = ambiguous.groups()
        return f"{key}: '{value}' is several values: add -m to sweep over them, or write a list as [{value}]"
    cause = error.__cause__
    full_key = getattr(cause, "full_key", None)
    if not full_key:
        return first
    reason = str(cause).splitlines()[0]
    unknown = re.match(r"Could not override '([^']+)'", first)
    if unknown:
        key = unknown.group(1)
        schema = APP_SCHEMAS.get(config_name)
        keys = list(schema_keys(schema)) if schema is not None and not key.startswith("hydra.") else []
        return f"{key}: unknown config key; check its spelling" + did_you_mean(key, keys)
    choices = re.match(r"Invalid value '(.*)', expected one of \[(.*)\]", reason)
    if choices:
        value, allowed = choices.group(1), choices.group(2).split(", ")
        return f"{full_key}: '{value}' is not one of {'|'.join(allowed)}" + did_you_mean(value, allowed)
    converted = re.match(r"Value '(.*)' of type '\w+' could not be converted to (\w+)", reason)
    if converted:
        return f"{full_key}: '{converted.group(1)}' is not a {converted.group(2).lower()}"
    return f"{full_key}: {reason}"


def _exit_with(message: str) -> None:
    print(f"mtrain: error: {message}", file=sys.stderr)
    sys.exit(2)


def _in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
