"""`~` in the paths a user types: a shell expands it only at the start of a word, never in `data.root=~/photos`,
and Hydra never does; hydrali expands it in every `key=~...` override (quoted too) before Hydra reads them."""

from __future__ import annotations

import os
import re

# key=~/..., key='~/...', key="~/...", key=~ ; the key may carry Hydra's +, ++ or ~ prefix
_HOME = re.compile(r"^(?P<key>[+~]{0,2}[\w.\-/@]+=)(?P<quote>['\"]?)(?P<path>~[^/'\"]*)(?P<rest>(?:/.*)?)$", re.S)


def expand_home(arguments: list[str]) -> list[str]:
    """`arguments` with `~` and `~user` at the start of an override's value made the home folder's path."""
    expanded = []
    for argument in arguments:
        found = _HOME.match(argument)
        if found:
            home = os.path.expanduser(found["path"])
            if home != found["path"]:  # an unknown ~user stays as typed
                argument = f"{found['key']}{found['quote']}{home}{found['rest']}"
        expanded.append(argument)
    return expanded
