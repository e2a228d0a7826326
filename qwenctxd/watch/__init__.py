"""File watching: one hub (``WatchHub``) shared by every subsystem of the daemon, and the one
per-key cache kept fresh by it (``WatchedCache``)."""

from qwenctxd.watch.cache import Watched, WatchedCache
from qwenctxd.watch.hub import Callback, FileChange, WatchHub, count_inotify_watches

__all__ = ["Callback", "FileChange", "Watched", "WatchedCache", "WatchHub",
           "count_inotify_watches"]
