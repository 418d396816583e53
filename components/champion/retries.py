"""How a Hub call is retried: its settings, apart from the Hub client, so that the options declaring them (the
publish step's) load without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# How often a call is tried, and how long before the first retry: the publish step's attempts and
# first_retry_wait_s default to these, and a step without those options reads with them.
DEFAULT_ATTEMPTS = 5
DEFAULT_FIRST_RETRY_WAIT_S = 2.0


class Retries(Protocol):
    """How a Hub call is retried (the publish step's options are one)."""

    @property
    def attempts(self) -> int: ...

    @property
    def first_retry_wait_s(self) -> float: ...


@dataclass(frozen=True)
class DefaultRetries:
    """The retries of a step that has no options for them."""

    attempts: int = DEFAULT_ATTEMPTS
    first_retry_wait_s: float = DEFAULT_FIRST_RETRY_WAIT_S
