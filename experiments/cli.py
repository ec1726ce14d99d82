"""How every entry point meets bad input: one line ``error: ...`` on stderr, exit status 2, no traceback.

``python -m experiments.cleanup|harvest|overcooked``, ``experiments.burnin`` and ``experiments.bench ...``
parse with :class:`ArgParser` and run under :func:`run_cli`:

- a bad flag value, an unknown flag or a missing required flag is an :class:`InputError` (argparse's own
  message, without the usage dump), as is every check of the inputs the commands make before any compute
  (files, values, run directories): each message names the file or value and the cause;
- :func:`run_cli` prints the message as one line and exits with :data:`INPUT_ERROR_STATUS`; ``--debug`` also
  prints the traceback (and the exception the message was made from);
- anything else (a bug, out of memory) keeps Python's traceback and exit status 1.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable

from jaxopt_marl.errors import INPUT_ERROR_STATUS, InputError  # noqa: F401 (re-exported)

DEBUG_FLAG = "--debug"


class ArgParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose usage errors raise :class:`InputError` (one line, naming the flag and
    the bad value) instead of printing the usage and exiting, and which takes ``--debug``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.add_argument(
            DEBUG_FLAG,
            action="store_true",
            help="on bad input, also print the traceback (default: one line 'error: ...')",
        )

    def error(self, message: str):
        """Raises :class:`InputError` with argparse's ``message`` (e.g. ``argument --seed: invalid int value:
        'x'``) and a pointer to ``--help``."""
        raise InputError(f"{message} (see {self.prog} --help)")


def positive(name: str, value: int | None, minimum: int = 1) -> None:
    """InputError unless ``value`` is None or at least ``minimum``; ``name`` is the flag as the user typed it."""
    if value is not None and value < minimum:
        raise InputError(f"{name} must be >= {minimum}, got {value}")


def run_cli(main: Callable[[list[str]], object], argv: list[str] | None = None):
    """``main(argv)`` (default ``sys.argv[1:]``); an :class:`InputError` is printed to stderr as its one line
    (with ``--debug`` in ``argv``: after the traceback) and becomes ``SystemExit(INPUT_ERROR_STATUS)``.

    Raises:
        SystemExit: status :data:`INPUT_ERROR_STATUS` on bad input; ``main``'s own SystemExit (``--help``: 0)
            passes through, as does every other exception.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return main(argv)
    except InputError as e:
        if DEBUG_FLAG in argv:
            cause = e.__cause__ or e.__context__
            if cause is not None:
                traceback.print_exception(cause)
            traceback.print_exception(e, chain=False)
        print(e.code, file=sys.stderr)
        raise SystemExit(INPUT_ERROR_STATUS) from None
