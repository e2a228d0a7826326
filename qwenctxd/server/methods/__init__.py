"""RPC method handlers, one module per method family: a class whose handler methods carry
their table entry (``@handler(methods.X)``); :mod:`qwenctxd.server.handlers` builds them."""
