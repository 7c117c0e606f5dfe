"""`mtrain CMD ...`: dispatch a subcommand to its Hydra app.

Hydra owns everything after the subcommand name (overrides, `-m`, `--cfg job`,
`--hydra-help`), so the subcommand is removed from sys.argv before the app is called;
`--help` is answered here, by mtrain.cli.help, before Hydra or torch is imported.
"""

from __future__ import annotations

import importlib
import os
import sys

COMMANDS = {
    "fit": ("mtrain.cli.fit", "train a tokenizer and a model, validate, checkpoint, test"),
    "translate": ("mtrain.cli.translate", "translate a file or stdin with a trained run"),
    "serve": ("mtrain.cli.serve", "translate over HTTP: a JSON API, LibreTranslate's API and a page"),
    "eval": ("mtrain.cli.evaluate", "score a run or a hypothesis file with sacreBLEU; compare runs"),
    "prepare": ("mtrain.cli.prepare", "tokenize and encode a corpus ahead of training"),
    "average": ("mtrain.cli.average", "average the parameters of several checkpoints"),
    "report": ("mtrain.cli.report", "tables and plots for a sweep of runs"),
    "export": (
        "mtrain.cli.export",
        "convert a run for CTranslate2, Argos Translate or transformers (format=ctranslate2|argos|hf)",
    ),
}


HELP_FLAGS = ("-h", "--help")


def usage() -> str:
    lines = ["usage: mtrain COMMAND [KEY=VALUE ...]", "       mtrain --version", "", "commands:"]
    lines += [f"  {name:<10} {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "`mtrain COMMAND --help` lists the command's config groups, presets and keys."]
    return "\n".join(lines)


def print_or_stop(text: str) -> None:
    """Print `text`; a reader that went away (`mtrain fit --help | head`) is no error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in HELP_FLAGS + ("help",):
        print(usage())
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    if sys.argv[1] in ("-V", "--version"):
        from mtrain import installed_version

        print(f"mtrain {installed_version()}")
        sys.exit(0)
    command = sys.argv[1]
    if command not in COMMANDS:
        print(f"mtrain: error: unknown command '{command}'\n\n{usage()}", file=sys.stderr)
        sys.exit(2)
    if any(arg in HELP_FLAGS for arg in sys.argv[2:]):
        from mtrain.cli.help import command_help

        overrides = [arg for arg in sys.argv[2:] if "=" in arg and not arg.startswith("-")]
        print_or_stop(command_help(command, overrides))
        sys.exit(0)
    module = importlib.import_module(COMMANDS[command][0])
    sys.argv = [f"mtrain {command}"] + sys.argv[2:]
    module.main()


if __name__ == "__main__":
    main()
