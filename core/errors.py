"""The one exception type for mistakes a user can fix (bad data, bad combination, bad path)."""


class HydraliError(Exception):
    """A user-fixable problem; its message names what to change. Printed as one line, no traceback."""
