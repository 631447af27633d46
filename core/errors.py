"""The one exception type for mistakes a user can fix (bad data, bad combination, bad path)."""

EXIT_USER_ERROR = 2  # the exit code of a command that a HydraliError ends: one line on stderr names what to fix


class HydraliError(Exception):
    """A user-fixable problem; its message names what to change. Printed as one line, no traceback."""


class SweepRefused(HydraliError):
    """A setting that no job of a sweep can run with: the sweep ends at once, in one line, instead of
    recording the same failure for every job."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message, or the name of its type when the message is empty."""
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


class CompositionError(HydraliError):
    """Hydra could not compose a config from `overrides` (a key that is not a setting, a bad value): the command
    line states it in one line (hydrali.core.cli.config_errors)."""

    def __init__(self, error: BaseException, overrides: list[str]):
        super().__init__(first_line(error))
        self.error = error
        self.overrides = list(overrides)
