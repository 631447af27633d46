"""The commands beside training: on a trained run, `hydrali eval|predict|export RUN_DIR [key=value ...]`; on a
dataset, `hydrali convert key=value ...`. Each prints its documented keys with `--help`; a mistake ends in one line
and exit code 2, with nothing written."""

from __future__ import annotations

import sys
from importlib import resources

from hydrali.core.cli.exit_codes import EXIT_INTERRUPTED, EXIT_USER_ERROR
from hydrali.core.errors import CompositionError, HydraliError

COMMANDS = {  # command -> the function(path, overrides) doing it
    "eval": "hydrali.core.inference.evaluate.evaluate",
    "predict": "hydrali.core.inference.predict.predict",
    "export": "hydrali.core.inference.export.export",
    "convert": "hydrali.core.data.convert.convert",
}
ON_A_RUN = ("eval", "predict", "export")  # the commands whose first argument is a run dir


def usage(command: str) -> str:
    """The command's usage line and its documented keys (its conf/<command>.yaml)."""
    text = resources.files("hydrali.conf").joinpath(f"{command}.yaml").read_text()
    what = "RUN_DIR [key=value ...]" if command in ON_A_RUN else "key=value ..."
    return f"usage: hydrali {command} {what}\n\n{text}"


def _os_error_line(err: OSError) -> str:
    """A file or folder that cannot be read or written, in one line naming the fix that fits its cause."""
    import errno

    where = f"{err.filename}: " if err.filename else ""
    if err.errno in (errno.ENOTDIR, errno.EEXIST):  # a file where a folder was to be made (out=<a file>)
        fix = "a file is in the way of a folder to write: pass out=<a new folder>"
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "fix its permissions or pass another out="
    elif err.errno == errno.ENOSPC:
        fix = "the disk is full: free space or pass out= on another disk"
    else:
        fix = "pass another out="
    return f"{where}{err.strerror or err}: {fix}"


def run_command(command: str, arguments: list[str]) -> None:
    """Run `hydrali <command> <arguments>` and exit: 0 done, 2 a mistake the one line names, 130 interrupted."""
    if any(a in ("-h", "--help") for a in arguments):
        print(usage(command))
        sys.exit(0)
    from hydra.utils import get_method

    from hydrali.core.config.store import register_schemas
    from hydrali.core.inference.schema import register_use_schemas

    try:
        register_schemas()  # hydrali's own and each registered plug-in's (idempotent)
    except HydraliError as err:
        print(f"hydrali: error: {err}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
    register_use_schemas()
    path = arguments[0] if arguments and "=" not in arguments[0] else None
    overrides = arguments[1:] if path is not None else arguments
    try:
        get_method(COMMANDS[command])(path, overrides)
    except CompositionError as err:
        from hydrali.core.cli.config_errors import composition_error_line

        print(f"hydrali: error: {composition_error_line(err.error, err.overrides)}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
    except HydraliError as err:
        print(f"hydrali: error: {err}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
    except OSError as err:  # a file or folder that cannot be read or written (a read-only run dir, out=...)
        print(f"hydrali: error: {_os_error_line(err)}", file=sys.stderr, flush=True)
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt:
        print(f"hydrali: {command} interrupted", file=sys.stderr, flush=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(0)
