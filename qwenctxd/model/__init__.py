"""The model endpoint client used by every side query (summaries, extraction, ranking).

Importing this package is cheap: ``openai`` is imported lazily by :class:`ModelClient` on its
first call.
"""

from qwenctxd.model.client import Completion, DeltaCallback, Message, ModelClient, parse_json_reply

__all__ = ["Completion", "DeltaCallback", "Message", "ModelClient", "parse_json_reply"]
