"""Session search: an FTS5 index of every transcript entry of every session file under
``<runtime>/projects/*/chats/`` (the daemon's and any other program's), kept in step
incrementally (:mod:`.indexer`), read from the files (:mod:`.reader`), stored in
:mod:`.index`, queried through :mod:`.query`."""

from qwenctxd.sessions.search.indexer import SessionSearch

__all__ = ["SessionSearch"]
