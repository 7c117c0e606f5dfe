"""What every Hydra app of mtrain shares: the config directory, the checks before a run,
and error handling.

`mtrain_app(config_name)` turns a task function into a command's `main()`. Before Hydra
runs the task (and so before it makes the run directory or writes `.hydra/`), `main()`
composes the config the same way Hydra will and refuses, in one line
`mtrain: error: <key>: <why>` with exit status 2, an override Hydra cannot apply (a misspelt
key, a wrong type, an unknown preset: with a "did you mean") and every bad value
(mtrain.config_checks), for each job of a `-m` sweep too. `HYDRA_FULL_ERROR=1` shows
Hydra's own error and stack trace instead. What this needs of Hydra's private API is
behind mtrain.hydra_internals.

In a sweep a failing job does not cancel the others: its reason goes into its directory's
`failed.json` (read by `mtrain report` and `mtrain eval runs=`), and once every job has run
the command exits with status 1, naming the failed jobs.
"""

from __future__ import annotations

import datetime
import functools
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from mtrain.config import APP_SCHEMAS, register_configs, to_typed
from mtrain.config_checks import check_config, check_writable_dir
from mtrain.config_names import did_you_mean, did_you_mean_key, list_item_schema, schema_keys, takes_a_list
from mtrain.errors import MtrainError
from mtrain.hydra_internals import (
    ErrorKind,
    compose_jobs,
    has_primary_config,
    primary_configs,
    read_command_line,
    read_composition_error,
    tell_hydra_the_mode,
)
from mtrain.rundir import RunDir, atomic_write_text

TaskConfig = TypeVar("TaskConfig")  # a command's config dataclass (FitConfig, EvalConfig, ...)


def find_config_dir(package: Path = Path(__file__).resolve().parents[1]) -> Path:  # noqa: B008 - fixed per install
    """mtrain/configs/ in an installed wheel (pyproject.toml maps configs/ there), else
    configs/ at the top of the checkout (`pip install -e .` or PYTHONPATH=checkout)."""
    installed = package / "configs"
    return installed if installed.is_dir() else package.parent / "configs"


CONFIG_DIR = str(find_config_dir())

register_configs()

log = logging.getLogger("mtrain")

# The exit status of a sweep in which a job failed (2 stays "refused before anything ran"), unless
# a stop signal ended a job: then 128 + its number, as for one run.
SWEEP_FAILED_STATUS = 1


@dataclass
class SweepOutcome:
    """The jobs of the `-m` sweep this process runs (Hydra's basic launcher runs them here, one
    after another) and the failed ones; read back from the sweep directory when a launcher ran
    them in other processes (`jobs_run_elsewhere`)."""

    overrides: dict[int, list[str]] = field(default_factory=dict)  # every job's, by job number
    failed: dict[int, Path] = field(default_factory=dict)  # job number -> its directory
    exit_status: int = SWEEP_FAILED_STATUS

    def failed_line(self) -> str:
        """`<n> of <jobs> sweep jobs failed: ...`: how a sweep with failed jobs ends. Each job is
        named by its number and the overrides that set it apart."""
        common = set.intersection(*(set(items) for items in self.overrides.values()))
        jobs = "; ".join(
            f"job {number} ({' '.join(o for o in self.overrides[number] if o not in common) or 'as the others'})"
            for number in self.failed
        )
        sweep_dir = next(iter(self.failed.values())).parent
        return (
            f"{len(self.failed)} of {len(self.overrides)} sweep jobs failed: {jobs}; each job's reason is "
            f"above and in its failed.json (`mtrain report {sweep_dir}` lists them)"
        )


_sweep = SweepOutcome()

# The run directory Hydra is about to make for this command, and each of its parents it makes
# with it (deepest first): what a refused run removes again while they are empty.
_new_directories: list[Path] = []


def mtrain_app(config_name: str) -> Callable[[Callable[[TaskConfig], Any]], Callable[..., Any]]:
    """Decorate `task(cfg)` into the `main()` of the command whose config is configs/<config_name>.yaml:
    checks before the run (see the module docstring), then Hydra, then `task` with MtrainError
    as one line. `main(cfg)` runs `task` on a given config (as Hydra's `cfg_passthrough`)."""

    def decorate(task: Callable[[TaskConfig], Any]) -> Callable[..., Any]:
        # Hydra passes a DictConfig; user_errors_as_messages hands `task` the command's dataclass.
        app = hydra.main(config_path=CONFIG_DIR, config_name=config_name, version_base="1.3")(
            user_errors_as_messages(task)
        )

        @functools.wraps(task)
        def main(cfg_passthrough: DictConfig | None = None) -> Any:
            _new_directories.clear()
            if cfg_passthrough is None:
                run_dir = check_before_run(config_name, sys.argv[1:])
                _new_directories.extend(missing_directories(run_dir) if run_dir is not None else [])
            _sweep.overrides, _sweep.failed, _sweep.exit_status = {}, {}, SWEEP_FAILED_STATUS
            started = time.time()
            try:
                return app(cfg_passthrough)
            finally:  # also when Hydra ends the sweep itself on a job's crash (its traceback, status 1)
                if cfg_passthrough is None and not _sweep.overrides and read_command_line(sys.argv[1:]).multirun:
                    jobs_run_elsewhere(started)
                if _sweep.failed:
                    print(f"mtrain: error: {_sweep.failed_line()}", file=sys.stderr)
                    sys.exit(_sweep.exit_status)

        return main

    return decorate


OUT_OF_MEMORY = (
    "out of memory (MemoryError): the command needed more memory than it could get; give it less at "
    "once (a smaller file, lower max_line_chars, smaller batches) or run it where more memory is free"
)


def user_errors_as_messages(app: Callable[..., Any]) -> Callable[..., Any]:
    """Check the config, run `app` on it as the command's dataclass (`mtrain.config.to_typed`);
    an MtrainError, or a MemoryError, becomes one line on stderr and exit status 2.

    In a multirun sweep the failing job is reported, recorded in its `failed.json`, and the
    sweep goes on: one diverged ablation must not cancel the others.
    """

    @functools.wraps(app)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        job_dir = _start_sweep_job() if _in_multirun() else None
        try:
            if args:
                check_config(args[0])
                # Checked: from here on the config travels as the command's typed dataclass.
                args = (to_typed(args[0]), *args[1:])
            try:
                return app(*args, **kwargs)
            except MemoryError:  # (a traceback would say nothing the user can act on)
                raise MtrainError(OUT_OF_MEMORY) from None
        except MtrainError as error:
            print(f"mtrain: error: {error}", file=sys.stderr)
            if job_dir is None:
                _remove_new_directories_if_empty()
            if job_dir is not None:
                log.error("job failed: %s", error)
                _record_failed_job(job_dir, str(error), type(error).__name__)
                if (status := getattr(error, "exit_status", 2)) > 128:
                    _sweep.exit_status = status
                return None
            sys.exit(getattr(error, "exit_status", 2))  # a stop signal exits 128 + its number
        except Exception as error:  # a bug: Hydra shows it, with its traceback, once the other jobs ran
            if job_dir is not None:
                first_line = str(error).splitlines()[0] if str(error) else "no detail"
                _record_failed_job(job_dir, f"{type(error).__name__}: {first_line}", type(error).__name__)
            raise

    return wrapper


def check_before_run(config_name: str, argv: list[str]) -> Path | None:
    """Compose `config_name` with the command line `argv` as Hydra will and check every job's
    config; on a problem print one `mtrain: error:` line and exit with status 2. Returns the
    run's directory (hydra.run.dir) of a single run, None for a sweep or Hydra's own flags.

    Hydra's own flags that compose nothing of ours (--help, --info, ...) or change where the
    config comes from (--config-name/-path/-dir) are left to Hydra, once a --config-name of
    ours is known to exist.
    """
    command_line = read_command_line(argv)
    if command_line.config_name is not None and not has_primary_config(CONFIG_DIR, command_line.config_name):
        configs = primary_configs(CONFIG_DIR)
        _exit_with(
            f"--config-name={command_line.config_name}: no such config in {CONFIG_DIR} (the configs: "
            f"{', '.join(configs)})" + did_you_mean(command_line.config_name, configs, "--config-name=")
        )
    if command_line.hydra_only:
        return None
    if command_line.prints_config and command_line.multirun:  # Hydra raises a ValueError with a traceback
        _exit_with(f"--cfg {command_line.printed_part} prints one config, not a sweep's: drop -m")
    run_dir = None
    try:
        jobs = compose_jobs(CONFIG_DIR, config_name, command_line.overrides, command_line.multirun)
        for job, cfg in jobs:
            try:
                if command_line.prints_config:
                    _check_printed_job(cfg, command_line.printed_part)
                else:
                    run_dir = _check_job(cfg, command_line.multirun)
            except MtrainError as error:
                raise MtrainError(f"{error} (sweep job {job})" if job else str(error)) from error
        if command_line.prints_config:
            return None  # Hydra prints the config, which would run
    except MtrainError as error:
        _exit_with(str(error))
    except Exception as error:  # Hydra's composition errors and the OmegaConf errors they wrap
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        _exit_with(composition_error_message(error, config_name))
    tell_hydra_the_mode(config_name, command_line.overrides, OmegaConf.select(jobs[0][1], "hydra.mode"))
    return None if command_line.multirun else run_dir


def _check_printed_job(cfg: DictConfig, part: str | None) -> None:
    """`--cfg`: print the config like Hydra and, when the command would refuse it, say so (the
    caller prints the refusal and exits with status 2) rather than show it as a config that runs.
    Nothing is written, so where the run would write is not checked."""
    with open_dict(cfg):
        task = cfg.copy()
        del task["hydra"]
    try:
        check_config(task)
    except MtrainError as error:
        shown = {"job": task, "hydra": OmegaConf.create({"hydra": cfg.hydra})}.get(part or "job", cfg)
        print(OmegaConf.to_yaml(shown), end="")
        raise MtrainError(f"{error} (--cfg: the config above composes, but the command refuses it)") from error


def _check_job(cfg: DictConfig, multirun: bool) -> Path | None:
    """Check one job's config and the directory Hydra makes for it; that directory."""
    with open_dict(cfg):
        task = cfg.copy()
        del task["hydra"]
    check_config(task)
    # Hydra makes the job's directory and opens its log there before the task runs.
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    directory = OmegaConf.select(cfg, key, throw_on_resolution_failure=False)
    if directory is None:
        return None
    check_writable_dir(Path(str(directory)), key)
    return Path(str(directory))


def missing_directories(path: Path) -> list[Path]:
    """`path` and its parents up to the first that exists, deepest first (absolute)."""
    missing = []
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def _remove_new_directories_if_empty() -> None:
    """After a refusal, remove the run directory Hydra made for this command (and the parents it
    made with it) while they are empty: a refused `mtrain fit` leaves nothing behind. Only when
    Hydra's directory is the one checked before it started: `${now:...}` may have moved on since."""
    if not (_new_directories and HydraConfig.initialized()):
        return
    if Path(HydraConfig.get().runtime.output_dir) != _new_directories[0]:
        return
    for directory in _new_directories:
        try:
            directory.rmdir()  # fails, and stops here, on a directory that is not empty
        except OSError:
            return


def composition_error_message(error: Exception, config_name: str) -> str:
    """One line `<key>: <why>[ (did you mean ...?)]` for an error Hydra raised while composing."""
    read = read_composition_error(error)
    if read.kind is ErrorKind.MISSING_PRESET:
        presets = [option for option in read.allowed if not option.endswith("_schema")]
        return f"{read.key}: no preset named '{read.value}' (the presets: {', '.join(presets)})" + did_you_mean(
            read.value, presets, f"{read.key}="
        )
    if read.kind is ErrorKind.NOT_AN_OVERRIDE:
        return f"{read.key}: not an override of the form key=value ({read.detail})"
    if read.kind is ErrorKind.NEEDS_QUOTES:
        character = f" ({read.detail!r})" if read.detail else ""
        return (
            f"{read.key}: '{read.value}' has a character{character} that an override takes only quoted; "
            f"quote the value: {read.key}=\"'{read.value}'\""
        )
    if read.kind is ErrorKind.SEVERAL_VALUES:
        if not takes_a_list(APP_SCHEMAS.get(config_name), read.key):
            return f"{read.key}: '{read.value}' is several values: add -m to sweep over them ({read.key} takes one)"
        return (
            f"{read.key}: '{read.value}' is several values: add -m to sweep over them, "
            f"or write a list as [{read.value}]"
        )
    if read.kind is ErrorKind.UNKNOWN_KEY:
        schema = APP_SCHEMAS.get(config_name)
        keys = list(schema_keys(schema)) if schema is not None and not read.key.startswith("hydra.") else []
        item = re.match(r"(.+)(\[\d+\]\.)", read.key)  # data.corpora[0].nmae: the item's keys
        if item and (item_schema := list_item_schema(schema, item.group(1))) is not None:
            keys = [f"{item.group(1)}{item.group(2)}{key}" for key in schema_keys(item_schema)]
        return f"{read.key}: unknown config key; check its spelling" + did_you_mean_key(read.key, keys)
    if read.kind is ErrorKind.NOT_A_CHOICE:
        return f"{read.key}: '{read.value}' is not one of {'|'.join(read.allowed)}" + did_you_mean(
            read.value, list(read.allowed)
        )
    if read.kind is ErrorKind.NOT_CONVERTIBLE:
        kind = read.allowed[0].lower()
        return f"{read.key}: '{read.value}' is not {'an' if kind[:1] in 'aeiou' else 'a'} {kind}"
    if read.kind is ErrorKind.OTHER_VALUE:
        return f"{read.key}: {read.detail}"
    return read.detail


def _exit_with(message: str) -> None:
    print(f"mtrain: error: {message}", file=sys.stderr)
    sys.exit(2)


def _in_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def jobs_run_elsewhere(started: float) -> None:
    """Fill `_sweep` from the sweep directory after a launcher ran the jobs in other processes
    (hydra/launcher=joblib), where this process's tally stays empty: each job of this sweep wrote
    its .hydra/hydra.yaml, and each failed one its failed.json (its number and overrides), after
    `started` (older files are an earlier sweep's)."""
    if not HydraConfig.initialized():
        return
    sweep_dir = Path(str(HydraConfig.get().sweep.dir))
    for job_dir in sorted(sweep_dir.iterdir() if sweep_dir.is_dir() else []):
        run = RunDir(job_dir)
        hydra_file = run.hydra_dir / "hydra.yaml"
        if hydra_file.is_file() and hydra_file.stat().st_mtime >= started:
            job = OmegaConf.load(hydra_file).hydra
            _sweep.overrides[int(job.job.num)] = [str(item) for item in job.overrides.task]
        if run.failed_file.is_file() and run.failed_file.stat().st_mtime >= started:
            record = json.loads(run.failed_file.read_text(encoding="utf-8"))
            _sweep.overrides[int(record["job"])] = [str(item) for item in record["overrides"]]
            _sweep.failed[int(record["job"])] = job_dir
    _sweep.failed = dict(sorted(_sweep.failed.items()))


def _start_sweep_job() -> Path:
    """Note the job; its directory, rid of a `failed.json` an earlier sweep left there."""
    hydra_cfg = HydraConfig.get()
    _sweep.overrides[int(hydra_cfg.job.num)] = [str(item) for item in hydra_cfg.overrides.task]
    job_dir = Path(hydra_cfg.runtime.output_dir)
    RunDir(job_dir).failed_file.unlink(missing_ok=True)
    return job_dir


def _record_failed_job(job_dir: Path, reason: str, kind: str) -> None:
    """Write the job's `failed.json` (its number, overrides, the one-line reason)."""
    number = int(HydraConfig.get().job.num)
    _sweep.failed[number] = job_dir
    record = {
        "job": number,
        "overrides": _sweep.overrides[number],
        "error": reason,
        "exception": kind,
        "time": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
    try:
        atomic_write_text(RunDir(job_dir).failed_file, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    except OSError as error:  # the reason was printed already; the other jobs still run
        log.warning("%s: could not record the failure (%s)", RunDir(job_dir).failed_file, error.strerror or error)
