"""Hydra's composition errors (a wrong override, an unknown group option) as one line that names the fix.

Hydra reports them over several lines (search path, object types); hydrali prints one line and exits 2,
as for its own config errors.
"""

from __future__ import annotations

import dataclasses
import re

from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from hydrali.core.config.validate import closest_hint
from hydrali.core.contracts.registry import replaced_keys

QUOTING = "https://hydra.cc/docs/advanced/override_grammar/basic/"
_MISSING_OPTION = re.compile(r"Could not find '([^']+)/([^']+)'")
_AVAILABLE = re.compile(r"Available options in '[^']+':\n((?:\t.*\n?)+)")
_OVERRIDE = re.compile(r"(?:Could not override|Error merging override) '?([^'\s]+)'?")


def _first_line(text: str) -> str:
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def _unparsable(overrides: list[str]) -> str | None:
    """The first override in `overrides` that Hydra's parser refuses, or None."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(override)
        except Exception:  # the parser's own error types vary with the mistake
            return override
    return None


def _split_value(overrides: list[str], bad: str) -> str | None:
    """The hint for an override that a space split in two (`a.b=1, 2` or `data.root=/my photos`), else None."""
    at = overrides.index(bad)
    before, after = overrides[at - 1] if at else None, overrides[at + 1] if at + 1 < len(overrides) else None
    if bad.endswith(",") and "=" in bad and after is not None and "=" not in after:
        return f"{bad} {after}: a sweep's values take no spaces: write {bad}{after}"
    if "=" not in bad and before is not None and "=" in before:
        key, _, value = before.partition("=")
        return (
            f"{bad} is not key=value: a space split the value of {key}; quote it: \"{key}='{value} {bad}'\" "
            f"(see {QUOTING})"
        )
    return None


def _parse_error(overrides: list[str]) -> str:
    arguments = [o for o in overrides if not o.startswith("-")]
    bad = _unparsable(arguments)
    if bad is None:
        options = [o for o in overrides if o.startswith("-") and o != "-m"]
        named = f" ({' '.join(options)} is not an option here)" if options else ""
        return f"an override cannot be parsed{named}: see {QUOTING}"
    split = _split_value(arguments, bad)
    if split is not None:
        return split
    key, _, value = bad.partition("=")
    if any(ord(ch) > 127 for ch in bad):
        return (
            f"{bad}: Hydra reads non-ASCII characters only inside quotes: write {key}='{value}' "
            f"(in a shell: \"{key}='{value}'\")"
        )
    if value.startswith("[") and value.endswith("]"):  # a list: its items quoted, not the list (then a string)
        items = ",".join(f"'{item.strip()}'" for item in value[1:-1].split(","))
        return (
            f"{bad} cannot be parsed: quote each item of the list that holds special characters such as '=', "
            f'e.g. "{key}=[{items}]" (see {QUOTING})'
        )
    return (
        f"{bad} cannot be parsed: quote a value holding spaces or special characters, e.g. "
        f"\"{key}='{value}'\" (see {QUOTING})"
    )


def _unknown_key(err: OmegaConfBaseException) -> str:
    key = err.full_key or str(err.key)
    group, _, _ = key.rpartition(".")
    fields = [f.name for f in dataclasses.fields(err.object_type)] if dataclasses.is_dataclass(err.object_type) else []
    where = f"a setting of {group}" if group else "a hydrali setting"
    known = fields or key in replaced_keys()
    hint = closest_hint(key, [f"{group}.{name}" if group else name for name in fields]) if known else ""
    return f"{key} is not {where}{hint}"


def composition_error_line(err: BaseException, overrides: list[str]) -> str:
    """One line for an error Hydra raised while composing the config from the command line `overrides`."""
    if isinstance(err, OverrideParseException):
        return _parse_error(overrides)
    if isinstance(err, OSError) and err.filename and not isinstance(err, MissingConfigException):  # the run dir
        return (
            f"cannot create the run dir {err.filename} ({err.strerror}): pass a writable hydra.run.dir "
            f"(hydra.sweep.dir under -m)"
        )
    text = str(err)
    if isinstance(err, MissingConfigException):
        missing, available = _MISSING_OPTION.search(text), _AVAILABLE.search(text)
        if missing:
            group, name = missing.groups()
            options = ", ".join(line.strip() for line in available.group(1).splitlines()) if available else "(none)"
            return f"{group}={name} is not an option of {group}: choose one of {options} (hydrali --help lists them)"
        return _first_line(text)
    cause = err.__cause__
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and "not in" in str(cause):
        return _unknown_key(cause)
    if isinstance(cause, OmegaConfBaseException):
        override = _OVERRIDE.search(text)
        what = override.group(1).rstrip(".") if override else (cause.full_key or _first_line(text))
        return f"{what}: {_first_line(str(cause))}"
    return " ".join(line.strip() for line in text.splitlines() if line.strip())
