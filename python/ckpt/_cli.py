"""The ``ckpt`` command installed with the package: the Rust ``ckpt`` tool, compiled into the extension."""

from __future__ import annotations

import signal
import sys


def main() -> None:
    """Runs ``ckpt`` on ``sys.argv`` and exits with its exit code."""
    from ._ckpt import main as run  # noqa: PLC0415

    # The tool behaves as the binary does: Ctrl-C stops it (Python's handler would wait for it to finish),
    # and a closed pipe ends it quietly.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.stdout.flush()
    sys.exit(run(sys.argv))


if __name__ == "__main__":
    main()
