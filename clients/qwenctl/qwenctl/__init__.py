"""qwenctl: the command-line client of qwenctxd (status, drain, stop, sessions, memory, ...)."""
