"""``qwenctl prompt`` and ``qwenctl instructions``: what the daemon would put in front of a
model for a directory, and which instruction files, rules and problems that came from.

``prompt`` writes the system prompt text to stdout byte for byte (plus one newline) so it can
be piped or diffed, and its summary (sections, sizes, files, prefix hash, problems) to stderr.
The prompt-shaping variables of *this* shell are sent along, so the text is the one a client
started here would get, whatever the daemon's own environment holds.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from qwenctl import render_instructions
from qwenctl.cmdutil import command_cwd, home_dir
from qwenctl.context import emit_json
from qwenctl.daemon_link import EXIT_OK
from qwenctxd.protocol import instructions as iwire
from qwenctxd.protocol import methods
from qwenctxd.protocol.instructions import PROMPT_ENV_KEYS

if TYPE_CHECKING:
    from qwenctl.context import Ctx

MODES = ("interactive", "headless", "acp")




def prompt_env() -> dict[str, str]:
    """The prompt-shaping variables set in qwenctl's own environment."""
    return {k: os.environ[k] for k in PROMPT_ENV_KEYS if k in os.environ}


def cmd_prompt(ctx: Ctx) -> int:
    a = ctx.args
    cwd = command_cwd(ctx)
    params = iwire.PromptSystemParams(cwd=cwd, model=a.model, append=a.append,
                                      env=prompt_env() or None)
    if a.mode is not None:
        params.interaction_mode = a.mode
    res = ctx.request(methods.PROMPT_SYSTEM, params)
    if a.json:
        emit_json(res)
        return EXIT_OK
    sys.stdout.flush()
    sys.stdout.buffer.write(res.text.encode("utf-8", errors="surrogatepass") + b"\n")
    sys.stdout.buffer.flush()
    render_instructions.prompt_report(res, cwd=cwd, home=home_dir(), stream=sys.stderr)
    return EXIT_OK


def cmd_instructions(ctx: Ctx) -> int:
    cwd = command_cwd(ctx)
    res = ctx.request(methods.INSTRUCTIONS_FILES, iwire.CwdParams(cwd=cwd))
    if ctx.args.json:
        emit_json(res)
    else:
        render_instructions.instructions_report(res, cwd=cwd, home=home_dir(), stream=sys.stdout)
    return EXIT_OK  # problems are information, not a failure
