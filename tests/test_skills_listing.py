"""Skill listing reminders, the constant Skill tool, and the loaded-skill text."""

from __future__ import annotations

import json
import re
from pathlib import Path

from qwenctxd.skills.listing import (
    SKILL_TOOL,
    first_line,
    load_text,
    render_delta,
    render_snapshot,
    visible,
)
from qwenctxd.skills.model import Level, Skill, SkillSet
from qwenctxd.skills.parse import parse_skill


def mk(name: str, desc: str = "does things", level: Level = "user", **kw) -> Skill:
    base = Path("/s") / name
    return Skill(name=name, description=desc, level=level, path=base / "SKILL.md",
                 base_dir=base, body=kw.pop("body", "Body"), **kw)


def names_in(text: str) -> list[str]:
    return re.findall(r"<name>\n(.*?)\n</name>", text)


def test_visible_rules() -> None:
    gated, _ = parse_skill(Path("/s/gated/SKILL.md"), "project",
                           text="---\nname: gated\ndescription: d\npaths: '*.py'\n---\nb")
    assert gated is not None
    ss = SkillSet(skills={s.name: s for s in [
        mk("a"),
        mk("hidden", disable_model_invocation=True),
        gated,
        mk("z", user_invocable=False),
    ]})
    assert [s.name for s in visible(ss, set())] == ["a", "z"]
    assert [s.name for s in visible(ss, {"gated", "hidden"})] == ["a", "gated", "z"]


def test_snapshot_format_and_escaping() -> None:
    skills = [mk("b", "Use <b> & \"q\"", level="project", when_to_use="when x < y"),
              mk("a", "plain", level="bundled")]
    text, rendered = render_snapshot(skills)
    assert rendered == ["a", "b"]
    assert text.startswith("<system-reminder>\n") and text.endswith("\n</system-reminder>")
    assert "<available_skills>\n<skill>\n<name>\na\n</name>\n" in text
    assert ("<description>\nUse &lt;b&gt; &amp; &quot;q&quot; — when x &lt; y (project)\n"
            "</description>\n<location>\nproject\n</location>\n</skill>") in text
    assert "<location>\nproject\n</location>" in text and "<location>\nbundled\n</location>" in text
    assert text.index("<name>\na\n</name>") < text.index("<name>\nb\n</name>")
    assert "<b>" not in text


def test_empty_snapshot() -> None:
    text, rendered = render_snapshot([])
    assert rendered == []
    assert "<system-reminder>" in text and "No skills" in text
    assert "<available_skills>" not in text


def test_budget_trims_descriptions_first() -> None:
    long_desc = "Short first line.\n" + "more detail " * 200
    skills = [mk(f"s{i}", long_desc, when_to_use="WHEN") for i in range(5)]
    text, rendered = render_snapshot(skills, budget_chars=2000)
    assert len(text) <= 2000
    assert rendered == [f"s{i}" for i in range(5)]
    assert "more detail" not in text and "WHEN" not in text
    assert text.count("<description>\nShort first line. (user)\n</description>") == 5
    assert "left out" not in text


def test_budget_with_300_skills_keeps_most_relevant_and_says_so() -> None:
    levels: list[Level] = ["bundled", "extension", "user", "project"]
    skills = [
        mk(f"skill-{i:03d}", f"{'Long description ' * 20}#{i}\nsecond line " * 5,
           level=levels[i % 4], when_to_use="always",
           priority=float(i % 7) if i % 2 else None)
        for i in range(300)
    ]
    text, rendered = render_snapshot(skills, budget_chars=8000)
    assert len(text) <= 8000
    assert 0 < len(rendered) < 300
    assert names_in(text) == rendered == sorted(rendered)
    left = 300 - len(rendered)
    assert f"{left} more skills are installed but left out" in text
    assert "skills.list" in text
    # 75 project skills cannot all fit, so only project skills are kept, highest priority first.
    project = sorted((s for s in skills if s.level == "project"),
                     key=lambda s: (-(s.priority or 0.0), s.name))
    assert set(rendered) == {s.name for s in project[: len(rendered)]}
    assert all(len(d) <= 200 for d in re.findall(r"<description>\n(.*?) \(\w+\)\n</description>", text))


def test_one_left_out_is_singular() -> None:
    skills = [mk("a", "x" * 150), mk("b", "y" * 150, level="bundled")]
    full, _ = render_snapshot(skills)
    text, rendered = render_snapshot(skills, budget_chars=len(full) - 60)
    assert rendered == ["a"]
    assert "1 more skill is installed" in text


def test_first_line_cap() -> None:
    assert first_line("\n\n  hello  \nworld") == "hello"
    cut = first_line("x" * 500)
    assert len(cut) == 200 and cut.endswith("…")


def test_delta_rendering() -> None:
    assert render_delta([], [], []) is None
    added = [mk("new", "First line\nsecond", when_to_use="W")]
    activated = [mk("api-rules", "Rules for <api>", level="project"), mk("new")]
    text = render_delta(added, ["old-one", 'we"ird'], activated)
    assert text is not None
    assert text.startswith("<system-reminder>") and text.endswith("</system-reminder>")
    assert names_in(text) == ["api-rules", "new"]
    assert "<description>\nFirst line (user)\n</description>" in text and "second" not in text
    assert "Rules for &lt;api&gt;" in text
    assert '"old-one"' in text and json.dumps('we"ird') in text
    only_removed = render_delta([], ["gone"], [])
    assert only_removed is not None and "<available_skills>" not in only_removed
    assert '"gone"' in only_removed
    only_added = render_delta([mk("x")], [], [])
    assert only_added is not None and "no longer" not in only_added


def test_delta_removed_then_readded_is_available() -> None:
    text = render_delta([mk("x")], ["x"], [])
    assert text is not None and names_in(text) == ["x"] and '"x"' not in text


def test_skill_tool_is_constant_and_names_no_skill() -> None:
    fn = SKILL_TOOL["function"]
    assert SKILL_TOOL["type"] == "function" and fn["name"] == "skill"
    params = fn["parameters"]
    assert params["required"] == ["skill"]
    assert set(params["properties"]) == {"skill", "args"}
    assert all(p["type"] == "string" for p in params["properties"].values())
    blob = json.dumps(SKILL_TOOL)
    for bundled in ("review-checklist", "stuck", "write-tests"):
        assert bundled not in blob
    assert "<skill>" not in blob


def test_load_text() -> None:
    s = mk("demo", body="Step 1.\nStep 2.")
    text = load_text(s)
    lines = text.split("\n")
    assert lines[0] == "Base directory for this skill: /s/demo"
    assert "relative path" in lines[1]
    assert lines[2] == ""
    assert text.endswith("Step 1.\nStep 2.\n")
