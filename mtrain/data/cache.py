"""The on-disk cache shared by tokenizers and encoded corpora: where it lives, how entries
are keyed, and how an entry is built so that a half-written one is never used.

An entry is a directory named by a hash of everything that determines its content. It is
built in a sibling temporary directory, gets a completion marker, and only then is renamed
into place; a reader trusts a directory only if it carries the marker. A build killed half
way leaves a `*.tmp-<pid>` directory behind, which the next build of the same entry detects,
reports and removes before rebuilding.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mtrain.config import to_plain
from mtrain.rundir import staged

COMPLETE_MARKER = "COMPLETE"


def cache_root(cache_dir: str | None) -> Path:
    """`data.cache_dir`, else `$MTRAIN_CACHE`, else `~/.cache/mtrain`."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get("MTRAIN_CACHE"):
        return Path(os.environ["MTRAIN_CACHE"]).expanduser()
    return Path.home() / ".cache" / "mtrain"


def fingerprint(*parts: Any) -> str:
    """A stable hex digest of JSON-able parts (config values, file fingerprints, versions)."""
    text = json.dumps([to_plain(part) for part in parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def is_complete(entry: Path) -> bool:
    return (entry / COMPLETE_MARKER).is_file()


@contextlib.contextmanager
def build_entry(entry: Path, log: Callable[[str], Any]) -> Iterator[Path]:
    """Yield a fresh temporary directory; on success publish it as `entry` (mtrain.rundir.staged).

    If another process published the same entry meanwhile (two ranks preparing at once),
    its copy is kept and ours discarded: both were built from the same inputs.
    """
    entry.parent.mkdir(parents=True, exist_ok=True)
    _remove_interrupted_builds(entry, log)
    if entry.exists():
        # Present but unmarked: left by a tool that copied the cache half way, or by hand.
        log(f"cache: {entry} is incomplete (no {COMPLETE_MARKER} marker); rebuilding it")
        shutil.rmtree(entry)
    with staged(
        entry, staging=entry.with_name(f"{entry.name}.tmp-{os.getpid()}"), keep_existing=is_complete
    ) as staging:
        yield staging
        (staging / COMPLETE_MARKER).write_text("ok\n", encoding="utf-8")


def _remove_interrupted_builds(entry: Path, log: Callable[[str], Any]) -> None:
    """Delete temporary directories of `entry` whose builder process no longer runs."""
    for staging in entry.parent.glob(f"{entry.name}.tmp-*"):
        pid_text = staging.name.rsplit("-", 1)[-1]
        if pid_text.isdigit() and int(pid_text) != os.getpid() and _process_alive(int(pid_text)):
            continue  # a concurrent build (another rank); it publishes or cleans up itself
        log(f"cache: found an interrupted preparation at {staging}; removing it and rebuilding")
        shutil.rmtree(staging, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
