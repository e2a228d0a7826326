"""Directory listings the watch hub compares across a watcher restart.

A watchfiles watcher covers a fixed directory set, so the hub restarts it whenever the set
changes (a project loaded, a directory created). Two windows of that restart are blind: the
changes the old watcher had collected but not yet reported (its debounce, up to 1.6 s) are
dropped when it is stopped, and nothing at all is watched between its stop and the moment the
new watcher's inotify watches exist. The hub closes both by listing the requested directories
before each watcher registers (``snapshot``) and again once it has; ``diff`` of the listing
taken before the previous watcher registered and the one taken after the new one did yields
every entry added, removed or changed meanwhile, which the hub hands to the subscribers as
synthetic changes. The intervals overlap, so a change may be reported twice (once for real,
once by the diff); a subscriber must treat a change as "look again", never count them.

An entry is identified by its inode, plus for a non-directory its mtime, ctime and size (a
subdirectory's own mtime moves with its contents, which a non-recursive watch never reports,
so only its replacement counts). Past ``STAT_LIMIT`` entries in one directory the rest are
known by name and inode only (``os.scandir`` gives both without a ``stat``): additions,
removals and atomic replacements still show, an in-place edit there does not.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from watchfiles import Change

__all__ = ["STAT_LIMIT", "Listing", "Listings", "diff", "snapshot"]

#: Entries of one directory whose ``stat`` a snapshot records (the rest: name and inode).
STAT_LIMIT = 4096

#: name -> identity of one directory's entries
Listing = dict[str, tuple[int, ...]]
#: directory -> its listing, None when it is missing or unreadable
Listings = dict[str, Listing | None]


def snapshot(dirs: Iterable[str]) -> Listings:
    """List each directory (blocking: run it in a worker thread)."""
    out: Listings = {}
    for d in dirs:
        listing: Listing = {}
        try:
            with os.scandir(d) as it:
                for n, entry in enumerate(it):
                    try:
                        if n >= STAT_LIMIT or entry.is_dir(follow_symlinks=False):
                            listing[entry.name] = (entry.inode(),)
                        else:
                            st = entry.stat(follow_symlinks=False)
                            listing[entry.name] = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns,
                                                   st.st_size)
                    except OSError:  # gone between the listing and its stat
                        continue
        except OSError:
            out[d] = None
            continue
        out[d] = listing
    return out


def _same(old: tuple[int, ...], new: tuple[int, ...]) -> bool:
    if len(old) != len(new):  # one side past STAT_LIMIT (or a file became a directory)
        return old[0] == new[0]
    return old == new


def diff(before: Mapping[str, Listing | None], after: Mapping[str, Listing | None]
         ) -> set[tuple[Change, str]]:
    """What changed in the directories listed in both: ``added``, ``deleted`` or ``modified``
    per entry, with full paths (a directory that appeared: all its entries ``added``; one that
    vanished: all of them ``deleted``)."""
    out: set[tuple[Change, str]] = set()
    for d, old in before.items():
        if d not in after:
            continue
        old_l, new_l = old or {}, after[d] or {}
        for name, ident in new_l.items():
            prev = old_l.get(name)
            if prev is None:
                out.add((Change.added, os.path.join(d, name)))
            elif not _same(prev, ident):
                out.add((Change.modified, os.path.join(d, name)))
        for name in old_l.keys() - new_l.keys():
            out.add((Change.deleted, os.path.join(d, name)))
    return out
