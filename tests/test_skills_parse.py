"""SKILL.md parsing: every field, every error, never raising."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qwenctxd.skills.parse import MAX_SKILL_BYTES, parse_skill, split_tools, validate_name

P = Path("/skills/demo/SKILL.md")


def parse(text: str):
    return parse_skill(P, "project", text=text)


def doc(front: str, body: str = "Do the thing.\n") -> str:
    return f"---\n{front.strip()}\n---\n{body}"


def test_minimal_skill() -> None:
    skill, errors = parse(doc("name: demo\ndescription: Demo skill", "\n\n  Body here.  \n\n"))
    assert errors == []
    assert skill is not None
    assert skill.name == "demo"
    assert skill.description == "Demo skill"
    assert skill.level == "project"
    assert skill.path == P
    assert skill.base_dir == P.parent
    assert skill.body == "Body here."
    assert skill.paths == () and not skill.conditional and not skill.matches("a.py")
    assert skill.allowed_tools == ()
    assert skill.model is None and skill.argument_hint is None and skill.when_to_use is None
    assert skill.disable_model_invocation is False
    assert skill.user_invocable is True
    assert skill.priority is None


def test_every_optional_field() -> None:
    front = """
name: full.skill_1
description: |
  First line.
  Second line.
allowed-tools: [Read, Grep]
model: qwen3-coder
argument-hint: "<file>"
when_to_use: when reviewing
disable-model-invocation: "true"
user-invocable: false
priority: 7
paths: ["src/**/*.ts", "*.md"]
hooks: {ignored: true}
"""
    skill, errors = parse(doc(front))
    assert errors == []
    assert skill is not None
    assert skill.name == "full.skill_1"
    assert skill.description == "First line.\nSecond line."
    assert skill.allowed_tools == ("Read", "Grep")
    assert skill.model == "qwen3-coder"
    assert skill.argument_hint == "<file>"
    assert skill.when_to_use == "when reviewing"
    assert skill.disable_model_invocation is True
    assert skill.user_invocable is False
    assert skill.priority == 7.0
    assert skill.paths == ("src/**/*.ts", "*.md")
    assert skill.conditional
    assert skill.matches("src/a/b/c.ts")
    assert skill.matches("README.md")
    assert not skill.matches("docs/README.md")
    assert not skill.matches("src/a.py")


def test_paths_single_string_and_dotfiles_match() -> None:
    skill, errors = parse(doc("name: lint\ndescription: d\npaths: '**/.eslintrc*'"))
    assert errors == []
    assert skill is not None and skill.paths == ("**/.eslintrc*",)
    assert skill.matches(".eslintrc.js")
    assert skill.matches("pkg/.eslintrc.json")


def test_allowed_tools_string_forms() -> None:
    skill, _ = parse(doc("name: a\ndescription: d\nallowed-tools: Read, Grep,Glob"))
    assert skill is not None and skill.allowed_tools == ("Read", "Grep", "Glob")
    skill, _ = parse(doc("name: a\ndescription: d\nallowed-tools: Read Bash(git diff:*) Edit"))
    assert skill is not None and skill.allowed_tools == ("Read", "Bash(git diff:*)", "Edit")
    assert split_tools("Bash(git status), Read") == ["Bash(git status)", "Read"]


def test_argument_hint_yaml_list_kept_as_written() -> None:
    skill, errors = parse(doc("name: a\ndescription: d\nargument-hint: [file]"))
    assert errors == []
    assert skill is not None and skill.argument_hint == "[file]"


@pytest.mark.parametrize("value,expected", [("true", True), ("'true'", True), ("TRUE", True),
                                            ("false", False), ("'false'", False)])
def test_disable_model_invocation_values(value: str, expected: bool) -> None:
    skill, errors = parse(doc(f"name: a\ndescription: d\ndisable-model-invocation: {value}"))
    assert errors == []
    assert skill is not None and skill.disable_model_invocation is expected


def test_priority_float() -> None:
    skill, _ = parse(doc("name: a\ndescription: d\npriority: -1.5"))
    assert skill is not None and skill.priority == -1.5


def test_missing_frontmatter() -> None:
    skill, errors = parse("# Just markdown\n")
    assert skill is None
    assert len(errors) == 1 and errors[0].path == str(P)
    assert "missing YAML frontmatter" in errors[0].message


def test_malformed_yaml() -> None:
    skill, errors = parse("---\nname: [unclosed\ndescription: x\n---\nbody\n")
    assert skill is None
    assert len(errors) == 1 and "invalid YAML" in errors[0].message


def test_unclosed_frontmatter_and_non_mapping() -> None:
    skill, errors = parse("---\nname: a\ndescription: b\n")
    assert skill is None and "not closed" in errors[0].message
    skill, errors = parse("---\n- a\n- b\n---\nbody")
    assert skill is None and "mapping" in errors[0].message


def test_missing_name_and_description_both_reported() -> None:
    skill, errors = parse(doc("model: x"))
    assert skill is None
    msgs = " | ".join(e.message for e in errors)
    assert "missing required field: name" in msgs
    assert "missing required field: description" in msgs


@pytest.mark.parametrize("front,needle", [
    ("name: a\ndescription: ''", "description is empty"),
    ("name: a\ndescription: '   '", "description is empty"),
    ("name: a\ndescription: 42", "description must be a string"),
    ("name: a", "missing required field: description"),
])
def test_bad_description(front: str, needle: str) -> None:
    skill, errors = parse(doc(front))
    assert skill is None
    assert any(needle in e.message for e in errors), errors


@pytest.mark.parametrize("name", ["a", "pdf", "my-skill", "v1.2_beta", "0day", "x" * 64])
def test_valid_names(name: str) -> None:
    assert validate_name(name) is None
    skill, errors = parse(doc(f"name: '{name}'\ndescription: d"))
    assert errors == [] and skill is not None and skill.name == name


@pytest.mark.parametrize("name", ["", "Upper", "has space", "../up", ".hidden", "-dash",
                                  "a/b", "<x>", "x" * 65, "ünï"])
def test_invalid_names(name: str) -> None:
    assert validate_name(name) is not None
    skill, errors = parse(doc(f"name: '{name}'\ndescription: d"))
    assert skill is None and len(errors) == 1 and errors[0].path == str(P)


@pytest.mark.parametrize("raw", ["123", "off", "yes", "[a]"])
def test_non_string_name(raw: str) -> None:
    skill, errors = parse(doc(f"name: {raw}\ndescription: d"))
    assert skill is None and "must be a string" in errors[0].message


def test_name_differs_from_directory_is_accepted() -> None:
    skill, errors = parse_skill(Path("/s/other-dir/SKILL.md"), "user",
                                text=doc("name: real-name\ndescription: d"))
    assert errors == [] and skill is not None and skill.name == "real-name"


@pytest.mark.parametrize("front,needle", [
    ("allowed-tools: 5", "allowed-tools must be"),
    ("allowed-tools: [Read, 3]", "non-string entries"),
    ("model: [a]", "model must be a string"),
    ("argument-hint: {a: 1}", "argument-hint must be a string"),
    ("when_to_use: 3", "when_to_use must be a string"),
    ("disable-model-invocation: maybe", "disable-model-invocation must be true or false"),
    ("user-invocable: 2", "user-invocable must be true or false"),
    ("priority: high", "priority must be a number"),
    ("priority: true", "priority must be a number"),
    ("priority: .nan", "finite"),
    ("paths: {a: b}", "paths must be a glob or a list"),
])
def test_bad_optional_field_reported_and_skill_still_loads(front: str, needle: str) -> None:
    skill, errors = parse(doc(f"name: a\ndescription: d\n{front}"))
    assert skill is not None, errors
    assert any(needle in e.message for e in errors), errors


def test_bad_glob_drops_only_itself() -> None:
    bad = "{1..2000}"
    skill, errors = parse(doc(f"name: a\ndescription: d\npaths: ['src/**', '{bad}', '']"))
    assert skill is not None
    keys = sorted(e.path for e in errors)
    assert keys == sorted([f"{P}#paths[{bad}]", f"{P}#paths[]"])
    assert skill.paths == ("src/**", bad)
    assert skill.conditional
    assert skill.matches("src/x.py")


def test_all_globs_bad_keeps_skill_gated() -> None:
    skill, errors = parse(doc("name: a\ndescription: d\npaths: '{1..2000}'"))
    assert skill is not None and len(errors) == 1
    assert skill.conditional and not skill.matches("anything")


def test_non_string_glob_entry() -> None:
    skill, errors = parse(doc("name: a\ndescription: d\npaths: ['*.py', 7]"))
    assert skill is not None and skill.paths == ("*.py",)
    assert [e.path for e in errors] == [f"{P}#paths[7]"]


def test_oversize_text_and_file(tmp_path: Path) -> None:
    big = doc("name: a\ndescription: d", "x" * (MAX_SKILL_BYTES + 10))
    skill, errors = parse(big)
    assert skill is None and "256 KiB" in errors[0].message
    f = tmp_path / "a" / "SKILL.md"
    f.parent.mkdir()
    f.write_text(big)
    skill, errors = parse_skill(f, "user")
    assert skill is None and "256 KiB" in errors[0].message


def test_reads_file_crlf_and_bom(tmp_path: Path) -> None:
    f = tmp_path / "demo" / "SKILL.md"
    f.parent.mkdir()
    f.write_bytes(b"\xef\xbb\xbf---\r\nname: demo\r\ndescription: d\r\n---\r\nBody\r\n")
    skill, errors = parse_skill(f, "user")
    assert errors == [] and skill is not None
    assert skill.body == "Body" and skill.base_dir == f.parent


def test_unreadable_file(tmp_path: Path) -> None:
    skill, errors = parse_skill(tmp_path / "missing" / "SKILL.md", "user")
    assert skill is None and "cannot read" in errors[0].message


def test_skill_equality_ignores_matcher() -> None:
    a, _ = parse(doc("name: a\ndescription: d\npaths: '*.py'"))
    b, _ = parse(doc("name: a\ndescription: d\npaths: '*.py'"))
    assert a == b and hash(a) == hash(b)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_never_raises(text: str) -> None:
    skill, errors = parse_skill(P, "user", text=text)
    assert skill is not None or errors


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["name", "description", "paths", "allowed-tools",
                                        "priority", "model", "user-invocable"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20),
                                 st.lists(st.text(max_size=10), max_size=3))))
def test_never_raises_on_field_types(fields: dict) -> None:
    import yaml

    text = "---\n" + yaml.safe_dump(fields) + "---\nbody\n"
    skill, errors = parse_skill(P, "user", text=text)
    assert skill is not None or errors
