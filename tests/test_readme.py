"""The README is the front page: the set-up commands CI runs, a quickstart, each workflow in a
few lines, and links to the reference pages under docs/ that hold the rest. Its commands, and
those of the pages it sends readers to, write only where git ignores (runs/, outputs/,
multirun/), so following them leaves the checkout clean."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The pages the README's reference detail lives in (docs/PERFORMANCE.md and ABLATIONS.md record
# measurements, with the commands as they were run on the machines named there).
REFERENCE_PAGES = ["docs/TRANSLATE.md", "docs/TRAINING.md", "docs/DATA.md", "docs/CONFIG.md"]
# Shell redirections and the keys that name files or directories a command writes.
WRITES = re.compile(r"(?:^|\s)>\s*(\S+)|\b(?:output|out|hydra\.run\.dir|hydra\.sweep\.dir)=(\S+)")
# The keys that name what a command reads: a run, a file, a tokenizer, a reranking partner.
READS = re.compile(
    r"(?:^|\s)(?:run|input|ref|hyp|init_from|tokenizer\.path|decode\.rerank\.(?:reverse_run|second_run|weights))=(\S+)"
)
# What CI (.ci/run) installs and runs: a newcomer types the same two commands.
SET_UP = [
    "pip install torch==2.13.0 && pip install -e '.[dev]'",
    "python -m pytest tests",
]


def text(page: str) -> str:
    return (REPO / page).read_text(encoding="utf-8")


def commands(page: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", text(page), flags=re.S)
    return [line.split(" #")[0] for block in blocks for line in block.splitlines() if not line.startswith("#")]


def anchors(page: str) -> set[str]:
    """GitHub's anchors of a page's headings: lowercased, punctuation dropped, spaces as `-`."""
    headings = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text(page), flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_commands_write_only_into_ignored_folders():
    ignored = {
        line.strip("/")
        for line in (REPO / ".gitignore").read_text(encoding="utf-8").splitlines()
        if line.endswith("/") and "*" not in line
    }
    for page in ["README.md", *REFERENCE_PAGES]:
        targets = [a or b for line in commands(page) for a, b in WRITES.findall(line)]
        if page == "README.md":
            assert "runs/test.de" in targets and "runs/m30k_ct2" in targets  # the quickstart is found
        outside = [target for target in targets if Path(target).parts[0] not in ignored and target != "/dev/null"]
        assert not outside, f"{page}: commands write into the checkout: {outside}"


def test_set_up_is_the_two_commands_ci_runs():
    first_block = commands("README.md")[: len(SET_UP)]
    assert [line.strip() for line in first_block] == SET_UP
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "pip install -q torch==2.13.0" in ci and "pip install -q -e '.[dev]'" in ci and "pytest tests" in ci


def test_the_readme_stays_a_front_page_whose_links_resolve():
    readme = text("README.md")
    words = len(readme.split())
    assert words < 2000, f"README.md has {words} words: move reference detail into docs/ (it was 4,741)"
    for page in REFERENCE_PAGES:
        assert page in readme, f"README.md does not link {page}"
    for page, anchor in re.findall(r"(docs/[A-Z]+\.md)(?:#([\w-]+))?", readme):
        assert (REPO / page).is_file(), page
        assert not anchor or anchor in anchors(page), f"README.md links {page}#{anchor}: no such heading"
    # What a newcomer must know before the first run: a smoke run's output is expected to be poor.
    assert "A man in a is is is is is in" in readme and "2-6 BLEU" in readme
    assert "split=test" in readme and "data.splits.test=null" in readme


def section(page: str, heading: str) -> str:
    """The text under `## heading`, up to the next heading of that level."""
    return text(page).split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_recipes_read_only_what_the_quickstart_or_an_earlier_command_wrote():
    """Every command runs as written, in order, from the quickstart's files: the README's, and
    the best-quality recipe's of docs/TRANSLATE.md (a reader once found `input=test.de` where
    the quickstart wrote runs/test.de, and a reverse run no command trained)."""
    readme = commands("README.md")
    quickstart = {
        a or b for line in readme for a, b in WRITES.findall(line) if "runs/m30k" in line or "runs/test" in line
    }
    recipe = [
        line.split(" #")[0]
        for block in re.findall(
            r"```bash\n(.*?)```", section("docs/TRANSLATE.md", "The best-quality recipe"), flags=re.S
        )
        for line in block.splitlines()
        if not line.startswith("#")
    ]
    assert len(recipe) >= 4 and any("tune_rerank.py" in line for line in recipe)
    for page, lines, written in (("README.md", readme, set()), ("the recipe", recipe, set(quickstart))):
        for line in lines:
            unread = [path for path in READS.findall(line) if path not in written]
            assert not unread, f"{page}: `{line.strip()}` reads {unread}, which no command before it writes"
            written |= {a or b for a, b in WRITES.findall(line)}
    compose_each(line for line in recipe if line.startswith("mtrain "))


def compose_each(lines) -> None:
    """Each `mtrain COMMAND KEY=VALUE ...` composes as the command composes it (in-process, as
    mtrain.cli.common.check_before_run does, after the command's own `friendly_overrides`): its
    keys and presets exist."""
    import shlex

    from mtrain.cli.common import CONFIG_DIR
    from mtrain.cli.overrides import friendly_overrides
    from mtrain.config import register_configs
    from mtrain.hydra_internals import compose_jobs

    register_configs()
    friendly = {"eval": friendly_overrides, "translate": lambda a: friendly_overrides(a, ("ensemble",), ())}
    for line in lines:
        command, *overrides = shlex.split(line)[1:]
        overrides = friendly.get(command, list)(overrides)
        assert compose_jobs(CONFIG_DIR, command, overrides, multirun=False), line


def test_the_pages_call_the_server_on_its_default_port():
    """`curl localhost:8000` against a server on 8080 fails: every address a page names uses
    `mtrain serve`'s default port, or one that page starts a server on (`port=N`)."""
    from mtrain.config import ServeConfig

    for page in ["README.md", *(str(path.relative_to(REPO)) for path in sorted((REPO / "docs").glob("*.md")))]:
        ports = {int(port) for port in re.findall(r"(?:localhost|127\.0\.0\.1):(\d+)", text(page))}
        started = {int(port) for port in re.findall(r"\bport=(\d+)", text(page))}
        assert ports <= {ServeConfig().port} | started, (
            f"{page} calls ports {sorted(ports)}; the server listens on 8080"
        )
