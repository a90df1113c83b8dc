"""The errors every layer shares: a bad setting, and a provider that cannot be read (no provider module defines
its own kind of failure)."""

import os


class ConfigError(Exception):
    """A setting is missing or invalid; the message names it, never a secret."""

    # sysexits.h's EX_CONFIG, what a process that stops on it exits with: a supervisor tells it from a crash (1).
    exit_code = os.EX_CONFIG

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def format_message(self) -> str:
        """The one line an operator reads: `configuration error: <message>`."""
        return f"configuration error: {self.message}"


class ProviderError(RuntimeError):
    """A provider could not be read (after its retries): a command's run fails, in one line."""


class ProviderUnavailableError(ProviderError):
    """The provider could not answer in time (no slot, unreachable, past the deadline, 429, 5xx): 503, retry."""


class NoSlotError(ProviderUnavailableError):
    """Every one of the process's slots is in flight."""


class OverBudgetError(ProviderUnavailableError):
    """The provider account's shared budget has no request to give now (app/providers/budget.py)."""

    def __init__(self, message: str, wait_seconds: float) -> None:
        super().__init__(message)
        self.wait_seconds = wait_seconds  # until the budget may give one


class RateLimitedError(ProviderUnavailableError):
    """The provider answered 429: it limits our requests (a command waits and asks again, budget.patiently)."""


class DeadlinePassedError(ProviderUnavailableError):
    """The call's deadline passed before its answer ended."""


class AnswerTooLargeError(ProviderUnavailableError):
    """The answer was larger than the call allows."""


class ProviderRefusedError(ProviderUnavailableError):
    """The provider refused our credentials (401, 403): 503 as any unavailable provider, and an alert: a
    misconfiguration, not the sender's fault."""


class BudgetSpentError(ProviderUnavailableError):
    """A host's budget for calls made before a request is proven authentic is spent for now: 503, retry."""
