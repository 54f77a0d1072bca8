"""Output folders vitexplain made: a marker file, so that a user's own folder is never written over.

A command that writes several files into one folder (the bench) first *claims* it: a folder that does not
exist, is empty, or already holds the marker is its own; a folder without the marker that holds any file the
command would write is the user's, and is refused in one line unless the user says ``force`` (``--force``), or
its content shows an earlier vitexplain made it before folders had the marker (``recognised``: it then gets
the marker). :func:`check_folder` decides without writing, :func:`mark_folder` writes the marker, :func:`claim`
does both; :func:`unmark_unused` takes the marker back from a folder a refused run left empty. The marker is a
hidden file, so a folder dataset never reads it, and a folder dataset skips every folder that holds it (a bench's
output folder placed inside the images folder is not read as images).
"""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

#: the marker file a vitexplain output folder holds (hidden: never listed as an image or a result)
MARKER = ".vitexplain-output"
#: the end of a refusal's line: what the user can do
FORCE_HINT = "name another folder, or pass --force (force=True) to replace them"


class FolderNotOurs(FileExistsError):
    """An output folder that vitexplain did not make holds files it would write."""


def made_by_vitexplain(folder: str | Path) -> bool:
    """Whether ``folder`` holds the marker of a vitexplain output folder."""
    return (Path(folder) / MARKER).is_file()


def check_folder(folder: str | Path, would_write: Iterable[str], what: str, force: bool = False,
                 recognised: Callable[[Path], bool] | None = None, hint: str = FORCE_HINT) -> list[str]:
    """Whether ``what`` may write into ``folder``, writing nothing: the user's files that ``force`` lets it replace
    (empty without ``force``, or when the folder is vitexplain's).

    ``would_write`` are the names (relative paths) the command writes there. A folder without the marker that
    holds any of them is refused with :class:`FolderNotOurs` (one line, ending in ``hint``) unless ``force``, or
    unless ``recognised(folder)`` says an earlier vitexplain, from before the marker, made it.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise FolderNotOurs(f"output folder {folder} is a file; name a folder (or a path that does not exist)")
    if not folder.is_dir() or made_by_vitexplain(folder):
        return []
    taken = sorted(name for name in would_write if os.path.lexists(folder / name))
    if not taken or (recognised is not None and recognised(folder)):
        return []
    if not force:
        shown = ", ".join(taken[:4]) + (", ..." if len(taken) > 4 else "")
        raise FolderNotOurs(f"output folder {folder} was not made by vitexplain and holds {shown}, which {what} "
                            f"would replace; {hint}")
    return taken


def mark_folder(folder: str | Path, what: str) -> bool:
    """Write the marker into ``folder`` (which exists) unless it holds one; returns whether it wrote it."""
    marker = Path(folder) / MARKER
    if marker.is_file():
        return False
    marker.write_text(json.dumps({"made_by": "vitexplain", "what": what}) + "\n")
    return True


def unmark_unused(folder: str | Path, ignore: Iterable[str] = ()) -> None:
    """Remove the marker of ``folder`` when nothing else is in it (but ``ignore``): a run refused before it wrote
    anything leaves a folder as it found it (an empty folder it created can then be removed)."""
    folder = Path(folder)
    with contextlib.suppress(OSError):
        if {entry.name for entry in folder.iterdir()} <= {MARKER, *ignore}:
            (folder / MARKER).unlink(missing_ok=True)


def claim(folder: str | Path, would_write: Iterable[str], what: str, force: bool = False,
          recognised: Callable[[Path], bool] | None = None, hint: str = FORCE_HINT) -> list[str]:
    """Make ``folder`` a ``what`` output folder: :func:`check_folder`, then create it and write the marker;
    returns the user's files that ``force`` lets be replaced."""
    taken = check_folder(folder, would_write, what, force, recognised, hint)
    Path(folder).mkdir(parents=True, exist_ok=True)
    mark_folder(folder, what)
    return taken
