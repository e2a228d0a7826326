"""Test support shipped with the package: a scripted OpenAI-compatible server and a helper
that spawns the real daemon in a scratch HOME. Used by our tests, benchmarks and by plugin
authors who want to test against a real daemon."""
