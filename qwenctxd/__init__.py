"""qwenctxd: one per-user daemon that assembles the context window for AI coding agents.

The daemon speaks JSON-RPC 2.0 over a Unix socket (see docs/protocol.md). This package holds
the daemon (``qwenctxd.server`` and the subsystems below it) and a small client library
(``qwenctxd.client``) used by qwenctl, editor plugins and the tests.
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1
