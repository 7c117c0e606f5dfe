"""The command line as users type it, turned into the overrides Hydra reads: `mtrain eval`,
`translate` and `report` pass their arguments through `friendly_overrides` before Hydra sees
them (a command's module imports no other command's: this is what they share).
"""

from __future__ import annotations

import re


def hydra_quote(value: str) -> str:
    """A value quoted for a Hydra override, so commas, spaces and brackets stay literal."""
    # Hydra reads a backslash as an escape only before a quote (or the closing quote).
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"


def friendly_overrides(
    argv: list[str], list_keys=("ref", "ensemble"), string_keys=("runs", "run", "hyp", "out", "src", "terms")
) -> list[str]:
    """Accept `ref=FILE`, `ref=A,B` and `runs=A,B` as users type them.

    Hydra would reject a plain string for a list key and read `A,B` as a sweep; list keys
    become `[A,B]` and string keys are quoted.
    """
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in list_keys and value and not value.startswith("["):
            arg = f"{key}=[" + ",".join(hydra_quote(part) for part in value.split(",")) + "]"
        elif sep and key in string_keys and "," in value and value[0] not in "'\"":
            arg = f"{key}={hydra_quote(value)}"
        out.append(arg)
    return out
