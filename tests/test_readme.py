"""The README's commands write only where git ignores (runs/, outputs/, multirun/), so
following the quickstart leaves the checkout clean."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Shell redirections and the keys that name files or directories a command writes.
WRITES = re.compile(r"(?:^|\s)>\s*(\S+)|\b(?:output|out|hydra\.run\.dir|hydra\.sweep\.dir)=(\S+)")


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(encoding="utf-8"), flags=re.S)
    return [line.split(" #")[0] for block in blocks for line in block.splitlines() if not line.startswith("#")]


def test_readme_commands_write_only_into_ignored_folders():
    ignored = {
        line.strip("/")
        for line in (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()
        if line.endswith("/") and "*" not in line
    }
    targets = [a or b for line in readme_commands() for a, b in WRITES.findall(line)]
    assert "runs/test.de" in targets and "runs/m30k_ct2" in targets  # the quickstart is found
    outside = [target for target in targets if Path(target).parts[0] not in ignored and target != "/dev/null"]
    assert not outside, f"README commands write into the checkout: {outside}"
