"""Test support shipped with the package: a scripted OpenAI-compatible server, a helper
that spawns the real daemon in a scratch HOME, and ``wait.until`` to wait on a condition
instead of a fixed sleep. Used by our tests, benchmarks and by plugin authors who want to test
against a real daemon."""
