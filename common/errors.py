"""User-facing failures: one readable paragraph, no traceback.

A user mistake (a missing file, a bad parameter, too many bad records) is not a
bug, so it must not look like one in the logs. Code raises ``UserError`` with a
message that names the file, line or parameter and the fix; ``exit_on_user_error``
turns it into that paragraph on stderr and exit status 2.
"""

from __future__ import annotations

import functools
import sys
import textwrap
from typing import Callable, NoReturn, TypeVar

T = TypeVar("T")

USER_ERROR_EXIT_CODE = 2


class UserError(Exception):
    """A problem the user can fix; the message says what and how."""


def one_line(text: object, limit: int) -> str:
    """``text`` with every run of whitespace made one space, cut at ``limit`` characters: a library's multi-line
    error or a server's answer quoted inside a one-paragraph message."""
    return " ".join(str(text).split())[:limit]


def report_and_exit(error: UserError) -> NoReturn:
    """Print ``error`` as one wrapped paragraph and exit without a traceback."""
    # Paths and run ids hold hyphens: never break inside them, so they stay copy-pasteable.
    paragraph = textwrap.fill(" ".join(str(error).split()), width=100, break_long_words=False, break_on_hyphens=False)
    print(f"error: {paragraph}", file=sys.stderr, flush=True)
    sys.exit(USER_ERROR_EXIT_CODE)


def exit_on_user_error(func: Callable[..., T]) -> Callable[..., T]:
    """Decorate a CLI entry point or component body so ``UserError`` exits cleanly."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except UserError as error:
            report_and_exit(error)

    return wrapper
