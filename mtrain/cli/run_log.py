"""A run's `train.log`: what `mtrain fit` logs, written into the run only once the run is accepted.

Hydra writes no log file for `mtrain fit` (configs/fit.yaml keeps only its console handler),
so a refused command (a resume on another corpus, a missing split, a run directory in use)
leaves the run's record as it was. `RunLog` collects the records from the start of the
command and, once every check has passed, writes them to the log file and every later one
after them: an accepted run's train.log reads as it always did, tokenizer and data lines
included.
"""

from __future__ import annotations

import logging
from pathlib import Path

# The format of Hydra's default job logging, which wrote train.log before (and still formats the console).
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


class RunLog(logging.Handler):
    """A handler on the root logger: holds records until `accept(path)`, then appends them
    and all later ones to `path`. Use it as a context manager (attached inside, removed after)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter(LOG_FORMAT))
        self._held: list[logging.LogRecord] = []
        self._file: logging.FileHandler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self._file is None:
            self._held.append(record)
        else:
            self._file.emit(record)

    def accept(self, path: Path) -> None:
        """The run is accepted: write what was held to `path` and log there from now on."""
        if self._file is not None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = logging.FileHandler(path, encoding="utf-8")  # appends: a resume continues the log
        self._file.setFormatter(self.formatter)
        for record in self._held:
            self._file.emit(record)
        self._held.clear()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._held.clear()
        super().close()

    def __enter__(self) -> RunLog:
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        logging.getLogger().removeHandler(self)
        self.close()
