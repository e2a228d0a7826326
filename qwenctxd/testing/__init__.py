"""Test support shipped with the package: a scripted OpenAI-compatible server, a helper
that spawns the real daemon in a scratch HOME (:mod:`~qwenctxd.testing.spawn`, forked from the
pre-imported :mod:`~qwenctxd.testing.forkserver`), the daemon's services and dispatcher served
in this process without a socket (:mod:`~qwenctxd.testing.inprocess`), and ``wait.until`` to
wait on a condition instead of a fixed sleep. Used by our tests, benchmarks and by plugin
authors who want to test against a real daemon.

Which daemon a test takes: ``InProcessDaemon`` (fixture ``inprocess_daemon``) for handler
tests that call methods and check results — the same services, dispatcher and per-connection
rules (session order, cancellation, notifications), no fork and no socket. ``SpawnedDaemon``
(fixtures ``daemon``, ``module_daemon``, ``spawn``) for anything about the process or the
wire: start-up and shutdown, signals and ``kill -9``, the socket and framing bytes, the
connection cap, the daemon's log, and ``qwenctl`` runs (a process that needs a socket).
"""
