"""docs/cli.md, generated from the parser so the reference never disagrees with it:

    python -m servescope.cli.reference > docs/cli.md

(a test fails when the file and the parser differ)."""

from __future__ import annotations

import argparse

from . import COMMANDS, build_parser

HEADER = """# Command line reference

Generated from the parser by `python -m servescope.cli.reference` (a test keeps it current).
The same flag means the same thing in every command that takes it: `--body FILE` is the
request body, `-c/--concurrency` the requests in flight, `-n/--requests` the measured
requests, `--timeout` the limit per request, `--json [FILE]` the report as JSON (to stdout
without FILE, the table then going to stderr), `--html FILE` the report as HTML,
`--ray [ADDRESS]` a Ray cluster (one started here without ADDRESS). Durations take `500ms`,
`10s`, `2m`. Bad arguments: one line on stderr, exit status 2.

Deprecated spellings, working for this release with a one-line warning: `doctor --payload
FILE` (use `--body`), `serve --ray-address ADDRESS` (use `--ray ADDRESS`), `python -m
servescope.instrument` (use `servescope instrument`).
"""


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest.upper()}`"
    names = ", ".join(f"`{s}`" for s in action.option_strings)
    if action.nargs == 0:
        return names
    metavar = action.metavar or action.dest.upper()
    if action.choices:
        metavar = "{" + ",".join(map(str, action.choices)) + "}"
    return f"{names} {'[' + metavar + ']' if action.nargs == '?' else metavar}"


def markdown() -> str:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = [HEADER]
    for command in COMMANDS:
        sub = subparsers.choices[command.NAME]
        out.append(f"\n## `servescope {command.NAME}`\n\n{command.HELP[0].upper()}{command.HELP[1:]}.\n")
        out.append("\n| argument | meaning |\n|---|---|")
        for action in sub._actions:
            if action.help == argparse.SUPPRESS or isinstance(action, argparse._HelpAction):
                continue
            out.append(f"| {_flags(action)} | {(action.help or '').replace('%%', '%').replace('|', '/')} |")
        if getattr(command, "EPILOG", None):
            out.append(f"\n{command.EPILOG[0].upper()}{command.EPILOG[1:]}.")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
