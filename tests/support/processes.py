"""The processes below a process, read from /proc (Linux): what a test checks is left after it ends a command."""

from __future__ import annotations

from pathlib import Path


def command_line(pid: int) -> str:
    """The command line of process `pid` (empty while it is being started)."""
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every process below `pid` now."""
    parents, commands = {}, {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                commands[int(entry.name)] = command_line(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    found, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        for child, ppid in parents.items():
            if ppid == parent and child not in found:
                found[child] = commands.get(child, "")
                todo.append(child)
    return found
