"""Automatic and manual session titles (the rules; the socket path is in test_qwenctl_sessions)."""

from __future__ import annotations

import pytest

from qwenctxd.protocol import errors
from qwenctxd.sessions.titles import AUTO_TITLE_CHARS, MAX_TITLE_CHARS, auto_title, manual_title


def test_auto_title_takes_the_first_non_blank_line() -> None:
    assert auto_title("\n\n  fix   the\tlogin test \nand more detail") == "fix the login test"
    assert auto_title("   \n\t") is None
    assert auto_title("修复登录测试") == "修复登录测试"


def test_auto_title_cuts_long_lines_at_a_word() -> None:
    text = "please refactor the authentication module so that " * 4
    t = auto_title(text)
    assert t is not None and t.endswith("…") and len(t) <= AUTO_TITLE_CHARS
    assert text.startswith(t[:-1])
    assert t[-2] != " "  # cut on a word boundary, no dangling space
    # one huge word is cut hard
    long_word = "x" * 500
    assert auto_title(long_word) == "x" * (AUTO_TITLE_CHARS - 1) + "…"


def test_manual_title_rules() -> None:
    assert manual_title("  Auth\n refactor ") == "Auth refactor"
    with pytest.raises(errors.InvalidParams) as blank:
        manual_title(" \n ")
    assert blank.value.data == {"field": "title", "message": "empty"}
    with pytest.raises(errors.InvalidParams) as long_:
        manual_title("y" * (MAX_TITLE_CHARS + 1))
    assert long_.value.data["field"] == "title" and "limit" in str(long_.value)
    assert manual_title("y" * MAX_TITLE_CHARS) == "y" * MAX_TITLE_CHARS


def test_reminder_text_is_never_a_title() -> None:
    from qwenctxd.sessions.titles import auto_title

    wrapped = ("<system-reminder>\nThis is the Qwen Code. We are setting up the context.\n"
               "</system-reminder>\n\nFix the flaky ARM test")
    assert auto_title(wrapped) == "Fix the flaky ARM test"
    assert auto_title("<system-reminder>\nonly context\n</system-reminder>") is None
    assert auto_title("<system-reminder>cut off, never closed") is None
    assert auto_title("Deploy <system-reminder>x</system-reminder> today") == "Deploy today"
