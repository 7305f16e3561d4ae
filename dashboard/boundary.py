"""The runs folder is the dashboard's boundary: it opens no file whose real path lies outside it.

The dashboard serves RUNS_DIR to whoever reaches its port, so a symlink
inside a run (``traces/rank1.json -> /etc/passwd``, ``run.json -> ~/x.json``,
``metrics -> /somewhere``) must not become a way to read the rest of the
machine. The analyzer follows symlinks, as a command a user runs on their
own files should; the dashboard therefore checks a run before it hands it
to the analyzer, and refuses the whole run when anything below it, at any
depth (hidden folders and checkpoints included: the analyzer's caches live
in hidden folders), resolves outside RUNS_DIR. Symlinks that stay inside
are fine. A refused run shows one line on its page naming the first such
path (never its target) and how many there are.

:func:`inside` is the one test of "is this path in the runs folder"; every
place the dashboard opens or lists a file asks it, directly or through
:func:`run_refusal`.
"""

from __future__ import annotations

import os
from pathlib import Path


def inside(root: Path, path: Path) -> bool:
    """Whether `path`, every symlink resolved, is `root` or lies below it.

    A path that cannot be resolved (a symlink loop) is not inside.
    """
    try:
        real = Path(path).resolve()
    except (OSError, RuntimeError):
        return False
    return real.is_relative_to(Path(root).resolve())


def links_out(root: Path, folder: Path) -> list[str]:
    """The paths below `folder` (relative, POSIX form, sorted) whose real path lies outside `root`.

    Walks every depth without following a symlink that leads out. A
    symlinked folder that stays inside is walked too (once per real folder,
    so a loop ends): its files are read through it.
    """
    root, folder = Path(root).resolve(), Path(folder)
    found: list[str] = []
    seen: set[Path] = set()

    def walk(path: Path, shown: str) -> None:
        try:
            real = path.resolve()
        except (OSError, RuntimeError):
            return
        if real in seen:
            return
        seen.add(real)
        try:
            entries = list(os.scandir(path))
        except OSError:
            return
        for entry in entries:  # DirEntry's type tests need no system call for plain files and folders
            if entry.is_symlink() and not inside(root, Path(entry.path)):
                found.append(f"{shown}{entry.name}")
            elif entry.is_dir():
                walk(Path(entry.path), f"{shown}{entry.name}/")

    walk(folder, "")
    return sorted(found)


def run_refusal(root: Path, folder: Path, name: str) -> str | None:
    """One line saying why the run `name` (at `folder`) is not read, or None when all of it lies in `root`."""
    if not inside(root, folder):
        return f"run {name}: it resolves outside the runs folder; the dashboard reads nothing outside it"
    out = links_out(root, folder)
    if not out:
        return None
    more = f", as do {len(out) - 1} more path(s)" if len(out) > 1 else ""
    return (
        f"run {name} not read: {out[0]} links outside the runs folder{more}; the dashboard opens nothing "
        "outside it (copy what it links to into the run, or use the analyzer command)"
    )
