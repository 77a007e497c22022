"""``servescope report FILE``: a saved report again, offline; ``--diagnose`` runs today's
rules on the evidence it saved."""

from __future__ import annotations

import argparse

from rich.console import Console

from . import common

NAME = "report"
HELP = "print a saved report again (JSON file, or a running server's /report)"
EPILOG = "with --diagnose, exit status as doctor's: 0 diagnosed, 1 a finding at --fail-on or worse, 3 the run could not diagnose"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", help="a report saved with --json, or a running server's http://HOST:PORT/report")
    parser.add_argument("--diagnose", action="store_true", help="run the rules again on the evidence a doctor report saved (offline)")
    common.add_fail_on(parser)
    common.add_outputs(parser)


def run(args: argparse.Namespace, console: Console) -> int:
    from ..doctor import diagnosed, exit_status
    from ..exceptions import ConfigError
    from ..renderers.terminal import render_terminal
    from ..report import Report

    report = Report.load(args.file)
    if args.diagnose:
        from ..doctor import MissingEvidence
        from ..rules import diagnose_report

        if diagnosed(report):
            try:
                report.findings = diagnose_report(report)
            except MissingEvidence as exc:
                raise ConfigError(f"{args.file}: {exc}; run `servescope doctor` to get one") from None
    elif args.fail_on:
        raise ConfigError("--fail-on goes with --diagnose (or with servescope doctor)")
    out = common.table_console(args, console)
    if args.json != common.STDOUT:  # `report FILE --json` prints the JSON alone, as it always has
        render_terminal(report, console=out)
    common.write_outputs(report, args, out)
    return exit_status(report, args.fail_on) if args.diagnose else 0
