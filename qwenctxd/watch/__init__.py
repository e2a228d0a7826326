"""File watching: one hub (``WatchHub``) shared by every subsystem of the daemon."""

from qwenctxd.watch.hub import Callback, FileChange, WatchHub, count_inotify_watches

__all__ = ["Callback", "FileChange", "WatchHub", "count_inotify_watches"]
