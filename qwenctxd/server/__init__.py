"""The daemon process: socket transport, connections, JSON-RPC dispatch, lifecycle, and the
handlers of every method family (``server.methods``); the only package that knows the wire."""
