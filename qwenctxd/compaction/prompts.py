"""Prompt text for compaction side queries: the state snapshot, recap and project summary.

All wording here is ours. Only the structural names are shared with Qwen Code so that tools
reading a compressed history find what they expect: the ``<analysis>`` scratch block, the
``<state_snapshot>`` element and its nine section tags, the ``<recap>`` element, and the
Markdown headings and ``[DONE]``/``[IN PROGRESS]``/``[TODO]`` markers of the project summary.

The resume trailer is not part of the compression prompt: it is appended once to the summary by
:mod:`qwenctxd.compaction.post_compact`, so the summarising model never spends output tokens
(or drifts in wording) reproducing it.
"""

from __future__ import annotations

__all__ = [
    "ACK_TEXT",
    "RESUME_TRAILER",
    "SNAPSHOT_SECTIONS",
    "SUMMARY_REQUEST",
    "compression_system_prompt",
    "project_summary_prompt",
    "recap_prompt",
]

SNAPSHOT_SECTIONS: tuple[tuple[str, str], ...] = (
    (
        "primary_request_and_intent",
        "What the user asked for, in full: every explicit request and the intent behind it, "
        "including constraints, preferences and corrections they stated along the way. When "
        "the goal shifted, say what it shifted from and to.",
    ),
    (
        "key_technical_concepts",
        "The languages, frameworks, libraries, tools, protocols and design ideas the work "
        "depends on, as a terse list. Name versions and flags when they mattered.",
    ),
    (
        "files_and_code_sections",
        "Every file that was read, created or changed, by path. For each: why it matters and "
        "what was done to it. Quote the code that the next steps depend on (signatures, the "
        "edited region, config values) exactly; skip code that is no longer relevant.",
    ),
    (
        "errors_and_fixes",
        "Each error, failing test or wrong turn, with the exact message where useful, what "
        "caused it and how it was resolved. Record user feedback that corrected the approach; "
        "note anything still unresolved.",
    ),
    (
        "problem_solving",
        "Problems already solved and how, and the reasoning behind decisions that are not "
        "obvious from the code. Include hypotheses still being tested.",
    ),
    (
        "all_user_messages",
        "Every message the user typed that is not a tool result, in order, quoted or closely "
        'paraphrased. Keep the short ones too ("ok", "go on", "no, the other one"): they '
        "show what was approved or rejected.",
    ),
    (
        "pending_tasks",
        "Work the user asked for that is not finished yet, as a list. Only tasks the user "
        'actually requested or agreed to; write "None" when nothing is outstanding.',
    ),
    (
        "current_work",
        "Precisely what was being worked on immediately before this snapshot: the file, the "
        "function, the command, the last change made and its state (done, half-written, "
        "untested). Quote the latest relevant code or output.",
    ),
    (
        "next_step",
        "The single next action, only if it follows directly from the user's most recent "
        "explicit request and the work in progress. Quote the recent conversation showing "
        "where things stopped, so the task can be picked up without drift. If the last "
        "request is complete and nothing was asked next, say so instead of inventing work.",
    ),
)
"""The nine ``<state_snapshot>`` sections, in order, with our guidance for each."""

_COMPRESSION_HEAD = """\
You are handing this coding session over to a fresh copy of yourself. The conversation so far \
is about to be removed from the context window and replaced by the snapshot you write now; \
nothing outside the snapshot will survive. Whoever continues must be able to carry on as if \
they had read the whole conversation: the user's goals, the code, the failures and the exact \
point where work stopped.

Work in two stages.

1. Draft inside <analysis> ... </analysis>. Walk through the conversation from start to end \
and note, for each stretch: what the user asked, what was done about it, which files and \
commands were involved, what went wrong, and what the user said about the result. Check that \
no request, decision or correction is missing. This draft is discarded before the snapshot is \
used, so be as thorough as you need.

2. Then write exactly one <state_snapshot> ... </state_snapshot> element containing the nine \
sections below, each as its own XML element, in this order, none omitted (write "None" for an \
empty one).

Rules for the snapshot:
- Be specific: real paths, identifiers, commands, numbers and error strings, not \
descriptions of them.
- Prefer what is true now over history: if a file was changed several times, describe its \
current state.
- Do not call tools, do not ask questions and do not add anything after the closing \
</state_snapshot> tag.
"""

_COMPRESSION_SHAPE = """\
Shape of the answer:

<analysis>
[your chronological draft]
</analysis>

<state_snapshot>
<primary_request_and_intent>...</primary_request_and_intent>
<key_technical_concepts>...</key_technical_concepts>
<files_and_code_sections>...</files_and_code_sections>
<errors_and_fixes>...</errors_and_fixes>
<problem_solving>...</problem_solving>
<all_user_messages>...</all_user_messages>
<pending_tasks>...</pending_tasks>
<current_work>...</current_work>
<next_step>...</next_step>
</state_snapshot>"""

SUMMARY_REQUEST = (
    "The conversation above is complete. Draft your walk-through inside <analysis> first, "
    "then write the <state_snapshot> element exactly once."
)
"""The last user message of the compression side query."""

RESUME_TRAILER = (
    "Pick the task up from the snapshot above, at the last step that was in progress, and keep "
    "working as if the conversation had never been shortened. Do not acknowledge or mention the "
    "snapshot, do not introduce yourself and do not greet the user: your next message should "
    "simply be the next piece of work."
)
"""Appended once to every summary placed at the head of a compacted history."""

ACK_TEXT = (
    "Understood. I have the snapshot of the session and will continue from where it left off."
)
"""The assistant turn that follows the summary, keeping user/assistant turns alternating."""


def compression_system_prompt() -> str:
    """The system prompt of the compression side query (``<analysis>`` then the snapshot)."""
    sections = "\n".join(
        f"{n}. <{tag}>: {guide}" for n, (tag, guide) in enumerate(SNAPSHOT_SECTIONS, start=1)
    )
    return f"{_COMPRESSION_HEAD}\nThe sections:\n{sections}\n\n{_COMPRESSION_SHAPE}"


_PROJECT_SUMMARY = """\
Write a project summary that a future session can load to get up to speed on this project \
without the conversation. Answer directly in Markdown, without calling tools, using exactly \
this outline:

# Project Summary

## Overall Goal
One sentence: what the user is trying to achieve.

## Key Knowledge
- Facts a newcomer must know: technology choices, conventions, build and test commands, \
important paths, constraints and user preferences stated in the conversation.

## Recent Actions
- What was accomplished recently and what was learned, with the files involved.

## Current Plan
1. [DONE] A step that is finished.
2. [IN PROGRESS] The step being worked on now.
3. [TODO] A step still to do.

Keep it factual and compact; prefer concrete names (files, functions, commands) over general \
descriptions, and leave out small talk."""

_RECAP = """\
You write the short "where were we" note a developer sees when returning to a coding session \
after a break. Read the conversation and reply with one to three plain sentences inside \
<recap>...</recap>: first what the user is working on, then the next step. No Markdown, no \
lists, no preamble, nothing outside the tags. Write in the language the conversation is held \
in (the user's language), not necessarily English. Do not continue the conversation or answer \
the user's last message; only describe it."""


def project_summary_prompt() -> str:
    """The system prompt of ``session.project_summary`` (Markdown with status markers)."""
    return _PROJECT_SUMMARY


def recap_prompt() -> str:
    """The system prompt of ``session.recap`` (1–3 sentences inside ``<recap>``)."""
    return _RECAP
