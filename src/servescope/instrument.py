"""Deprecated spelling of ``servescope instrument``, kept for one release:

    python -m servescope.instrument path/to/app.py:app --port 8000
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from .cli import main as cli_main

    sys.stderr.write("servescope: `python -m servescope.instrument` is deprecated: use `servescope instrument`\n")
    return cli_main(["instrument", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
