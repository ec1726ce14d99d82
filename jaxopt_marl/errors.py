"""Bad input: :class:`InputError`, raised by the checks that every entry point makes before any compute.

:func:`experiments.cli.run_cli` prints its message as one line ``error: ...`` and exits with
:data:`INPUT_ERROR_STATUS`; the library's checks (:mod:`jaxopt_marl.preflight`, :mod:`jaxopt_marl.pipeline`) raise
it, so it lives here rather than in the command line's module.
"""

from __future__ import annotations

# Exit status of InputError from the command line (argparse's for bad usage).
INPUT_ERROR_STATUS = 2


class InputError(SystemExit):
    """Bad command-line input, raised before any compute; :func:`experiments.cli.run_cli` prints the message and
    exits with status :data:`INPUT_ERROR_STATUS` (raised uncaught, a SystemExit with a message exits with
    status 1)."""

    def __init__(self, msg: str):
        super().__init__(f"error: {msg}")


__all__ = ["INPUT_ERROR_STATUS", "InputError"]
