"""`mtrain CMD ...`: dispatch a subcommand to its Hydra app.

Hydra owns everything after the subcommand name (overrides, `-m`, `--cfg job`, `--help`),
so the subcommand is removed from sys.argv before the app is called.
"""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    "fit": ("mtrain.cli.fit", "train a tokenizer and a model, validate, checkpoint, test"),
    "translate": ("mtrain.cli.translate", "translate a file or stdin with a trained run"),
    "eval": ("mtrain.cli.evaluate", "score a run or a hypothesis file with sacreBLEU; compare runs"),
    "prepare": ("mtrain.cli.prepare", "tokenize and encode a corpus ahead of training"),
    "average": ("mtrain.cli.average", "average the parameters of several checkpoints"),
    "report": ("mtrain.cli.report", "tables and plots for a sweep of runs"),
    "export": ("mtrain.cli.export", "convert a run for an inference engine (CTranslate2)"),
}


def usage() -> str:
    lines = ["usage: mtrain COMMAND [hydra overrides ...]", "", "commands:"]
    lines += [f"  {name:<10} {help_text}" for name, (_, help_text) in COMMANDS.items()]
    lines += ["", "`mtrain COMMAND --help` shows the command's configuration and overrides."]
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help", "help"):
        print(usage())
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    command = sys.argv[1]
    if command not in COMMANDS:
        print(f"mtrain: error: unknown command '{command}'\n\n{usage()}", file=sys.stderr)
        sys.exit(2)
    module = importlib.import_module(COMMANDS[command][0])
    sys.argv = [f"mtrain {command}"] + sys.argv[2:]
    module.main()


if __name__ == "__main__":
    main()
