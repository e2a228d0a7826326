"""``qwenctl proxy``: an OpenAI-compatible chat-completions proxy that runs every request
through the daemon's context pipeline (instructions, recalled memories, rules, skills,
compaction, recording) and streams the upstream model's reply through unchanged.

Modules: ``keys`` (the bearer key, project path prefixes, ``proxy env`` lines), ``reply``
(accumulating an upstream reply, streamed or not, into the assistant message to record),
``mapping`` (the client's history onto a daemon session), ``app`` (the ASGI app: routes,
auth, limits, upstream calls) and ``command`` (the qwenctl sub-commands).
"""
