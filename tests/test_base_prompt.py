"""Base system prompt sections, tool-call style selection, and the system.md env overrides."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from qwenctxd.instructions.base_prompt import (
    SECTION_ORDER,
    BasePromptInputs,
    base_sections,
    build_base_prompt,
    identity_section,
    sandbox_section,
)
from qwenctxd.instructions.system_md import (
    SystemIdentityFileError,
    SystemPromptFileMissing,
    load_identity,
    load_system_md,
    resolve_path_from_env,
    write_system_md,
)
from qwenctxd.instructions.tool_examples import examples, select_style
from qwenctxd.protocol.errors import SYSTEM_PROMPT_FILE_ERROR, QwenctxdError

# --- tool-call style ------------------------------------------------------------------------

LONG_CODER = "qwen3-coder-" + "x" * 138


@pytest.mark.parametrize(
    ("model", "style"),
    [
        ("qwen3-coder-plus", "qwen-coder"),
        ("Qwen2.5-Coder-32B", "qwen-coder"),
        ("qwen-vl-max", "qwen-vl"),
        ("qwen2.5-vl-72b-instruct", "qwen-vl"),
        ("gpt-4o", "general"),
        ("coder-model-x", "qwen-coder"),
        ("qwen3-max", "general"),
        (LONG_CODER, "general"),
        (None, "general"),
        ("", "general"),
    ],
)
def test_style_from_model_name(model: str | None, style: str) -> None:
    assert select_style(model, None) == style


def test_long_name_guard_is_strict_at_100() -> None:
    name = "qwen3-coder-" + "x" * 88
    assert len(name) == 100
    assert select_style(name, None) == "general"
    assert select_style(name[:99], None) == "qwen-coder"


@pytest.mark.parametrize("forced", ["qwen-coder", "qwen-vl", "general", "gemma4"])
@pytest.mark.parametrize("model", ["qwen3-coder-plus", "qwen-vl-max", "gpt-4o", LONG_CODER])
def test_env_forces_style(model: str, forced: str) -> None:
    assert select_style(model, forced) == forced
    assert select_style(model, f"  {forced.upper()} ") == forced


@pytest.mark.parametrize("env", ["banana", "", "   "])
def test_unknown_env_style_is_ignored(env: str) -> None:
    assert select_style("qwen3-coder-plus", env) == "qwen-coder"
    assert select_style("gpt-4o", env) == "general"


def test_examples_use_each_style_syntax() -> None:
    coder = examples("qwen-coder")
    assert "<tool_call>\n<function=run_shell_command>" in coder
    assert "<parameter=is_background>\ntrue\n</parameter>" in coder
    vl = examples("qwen-vl")
    payloads = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", vl)
    assert payloads and all(set(json.loads(p)) == {"name", "arguments"} for p in payloads)
    general = examples("general")
    assert "[tool_call: run_shell_command for 'npm run dev' in the background]" in general
    assert "<tool_call>" not in general
    gemma = examples("gemma4")
    assert (
        '<|tool_call>call:run_shell_command{command:<|"|>npm run dev<|"|>,is_background:true}'
        in gemma
    )
    # Same scenarios in every style.
    counts = {
        s: examples(s).count("<example>") for s in ("qwen-coder", "qwen-vl", "general", "gemma4")
    }
    assert len(set(counts.values())) == 1 and counts["general"] >= 5
    assert len(payloads) == general.count("[tool_call:")


def test_examples_section_follows_model() -> None:
    def ex(**kw: object) -> str:
        return dict(base_sections(BasePromptInputs(**kw)))["tool_call_examples"]  # type: ignore[arg-type]

    assert "<function=" in ex(model="qwen3-coder-plus")
    assert '{"name": ' in ex(model="qwen-vl-max")
    assert "[tool_call:" in ex(model="gpt-4o")
    assert '{"name": ' in ex(model="gpt-4o", tool_call_style_env="qwen-vl")


# --- sections --------------------------------------------------------------------------------

SANDBOX_HEADINGS = {"# macOS Seatbelt", "# Sandbox", "# Outside of Sandbox"}


@pytest.mark.parametrize(
    ("value", "heading"),
    [
        ("sandbox-exec", "# macOS Seatbelt"),
        ("docker", "# Sandbox"),
        ("podman", "# Sandbox"),
        (None, "# Outside of Sandbox"),
        ("", "# Outside of Sandbox"),
    ],
)
def test_sandbox_variant(value: str | None, heading: str) -> None:
    assert sandbox_section(value).startswith(heading + "\n")
    prompt = build_base_prompt(BasePromptInputs(sandbox=value))
    present = {h for h in SANDBOX_HEADINGS if re.search(rf"^{re.escape(h)}$", prompt, re.M)}
    assert present == {heading}
    sections = dict(base_sections(BasePromptInputs(sandbox=value)))
    assert sections["sandbox"].startswith(heading)


def test_git_section_only_in_repo() -> None:
    outside = dict(base_sections(BasePromptInputs(in_git_repo=False)))
    inside = dict(base_sections(BasePromptInputs(in_git_repo=True)))
    assert "git" not in outside
    assert inside["git"].startswith("# Git Repository")
    assert "# Git Repository" not in build_base_prompt(BasePromptInputs(in_git_repo=False))


def test_sections_in_documented_order() -> None:
    names = [n for n, _ in base_sections(BasePromptInputs(in_git_repo=True, model="gpt-4o"))]
    assert names == list(SECTION_ORDER)
    assert names == [
        "identity",
        "core_mandates",
        "task_management",
        "workflows",
        "operational_guidelines",
        "sandbox",
        "actions",
        "git",
        "tool_call_examples",
        "final_reminder",
    ]
    without_git = [n for n, _ in base_sections(BasePromptInputs())]
    assert without_git == [n for n in SECTION_ORDER if n != "git"]


@pytest.mark.parametrize("mode", ["interactive", "headless", "acp"])
def test_build_is_trimmed_and_joined(mode: str) -> None:
    inputs = BasePromptInputs(in_git_repo=True, interaction_mode=mode)  # type: ignore[arg-type]
    prompt = build_base_prompt(inputs)
    assert prompt == prompt.strip()
    assert prompt == "\n\n".join(text for _, text in base_sections(inputs))
    assert all(text and text == text.strip() for _, text in base_sections(inputs))
    words = len(prompt.split())
    assert 500 < words < 2500


def test_interaction_mode_changes_role_and_questions() -> None:
    prompts = {
        m: build_base_prompt(BasePromptInputs(interaction_mode=m))  # type: ignore[arg-type]
        for m in ("interactive", "headless", "acp")
    }
    assert len(set(prompts.values())) == 3
    assert "never ask the user anything" in prompts["headless"]
    assert "never ask the user anything" not in prompts["interactive"]
    assert "ACP" in identity_section("acp")


def test_identity_override_replaces_only_identity() -> None:
    custom = BasePromptInputs(identity_text="You are Bob, a careful reviewer.\n")
    sections = dict(base_sections(custom))
    assert sections["identity"] == "You are Bob, a careful reviewer."
    default = dict(base_sections(BasePromptInputs()))
    assert {k: v for k, v in sections.items() if k != "identity"} == {
        k: v for k, v in default.items() if k != "identity"
    }
    assert identity_section("interactive", "   ") == identity_section("interactive")


def test_from_environ_reads_sandbox_and_style() -> None:
    env = {"SANDBOX": "sandbox-exec", "QWEN_CODE_TOOL_CALL_STYLE": "qwen-vl"}
    inputs = BasePromptInputs.from_environ(env, model="gpt-4o", in_git_repo=False)
    assert inputs.sandbox == "sandbox-exec" and inputs.tool_call_style_env == "qwen-vl"


# --- QWEN_SYSTEM_MD / QWEN_WRITE_SYSTEM_MD --------------------------------------------------


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    cwd, home = tmp_path / "proj", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    return cwd, home


@pytest.mark.parametrize("value", [None, "", "  ", "0", "false", "FALSE", " False "])
def test_resolve_disabled(value: str | None, dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    assert resolve_path_from_env(value, cwd=cwd, home=home) == (False, None)


@pytest.mark.parametrize("value", ["1", "true", "TRUE", " True "])
def test_resolve_switch_on(value: str, dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    assert resolve_path_from_env(value, cwd=cwd, home=home) == (True, cwd / ".qwen" / "system.md")


def test_resolve_paths(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    assert resolve_path_from_env("~/x.md", cwd=cwd, home=home) == (True, home / "x.md")
    assert resolve_path_from_env("~", cwd=cwd, home=home) == (True, home)
    assert resolve_path_from_env(" sub/../p.md ", cwd=cwd, home=home) == (True, cwd / "p.md")
    assert resolve_path_from_env("/etc/x.md", cwd=cwd, home=home) == (True, Path("/etc/x.md"))
    assert resolve_path_from_env("~x.md", cwd=cwd, home=home) == (True, cwd / "~x.md")


def test_system_md_switch_missing_raises(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    with pytest.raises(SystemPromptFileMissing) as info:
        load_system_md({"QWEN_SYSTEM_MD": "1"}, cwd, home)
    expected = cwd / ".qwen" / "system.md"
    assert str(info.value) == f"missing system prompt file '{expected}'"
    assert isinstance(info.value, QwenctxdError)
    assert info.value.to_wire()["code"] == SYSTEM_PROMPT_FILE_ERROR == -32010
    assert info.value.to_wire()["data"]["path"] == str(expected)


@pytest.mark.parametrize("env", [{}, {"QWEN_SYSTEM_MD": "0"}, {"QWEN_SYSTEM_MD": "false"}])
def test_system_md_disabled_uses_builtin(env: dict[str, str], dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    (cwd / ".qwen").mkdir()
    (cwd / ".qwen" / "system.md").write_text("ignored")
    assert load_system_md(env, cwd, home) is None


def test_system_md_loads_files(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    (cwd / ".qwen").mkdir()
    (cwd / ".qwen" / "system.md").write_text("default override\n")
    assert load_system_md({"QWEN_SYSTEM_MD": "true"}, cwd, home) == "default override\n"
    (cwd / "mine.md").write_text("path override")
    assert load_system_md({"QWEN_SYSTEM_MD": "mine.md"}, cwd, home) == "path override"
    (home / "x.md").write_text("home override")
    assert load_system_md({"QWEN_SYSTEM_MD": "~/x.md"}, cwd, home) == "home override"
    with pytest.raises(SystemPromptFileMissing, match="nope.md"):
        load_system_md({"QWEN_SYSTEM_MD": "~/nope.md"}, cwd, home)


def test_write_system_md(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    assert write_system_md({}, cwd, home, "base") is None
    assert write_system_md({"QWEN_WRITE_SYSTEM_MD": "0"}, cwd, home, "base") is None
    written = write_system_md({"QWEN_WRITE_SYSTEM_MD": "1"}, cwd, home, "base text")
    assert written == cwd / ".qwen" / "system.md"
    assert written.read_text() == "base text"
    again = write_system_md({"QWEN_WRITE_SYSTEM_MD": "TRUE"}, cwd, home, "changed")
    assert again == written and written.read_text() == "changed"
    deep = write_system_md({"QWEN_WRITE_SYSTEM_MD": "~/a/b/out.md"}, cwd, home, "x")
    assert deep == home / "a" / "b" / "out.md" and deep.read_text() == "x"
    # Round trip: what was written is what QWEN_SYSTEM_MD loads.
    assert load_system_md({"QWEN_SYSTEM_MD": "1"}, cwd, home) == "changed"
    assert sorted(p.name for p in written.parent.iterdir()) == ["system.md"]  # no temp left


def test_write_system_md_failure_is_logged_not_raised(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    (cwd / "file").write_text("")
    assert write_system_md({"QWEN_WRITE_SYSTEM_MD": "file/out.md"}, cwd, home, "x") is None


# --- QWEN_SYSTEM_IDENTITY_MD -----------------------------------------------------------------


def test_identity_unset_or_switch_is_ignored(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    for env in (
        {},
        {"QWEN_SYSTEM_IDENTITY_MD": ""},
        {"QWEN_SYSTEM_IDENTITY_MD": "1"},
        {"QWEN_SYSTEM_IDENTITY_MD": "false"},
    ):
        assert load_identity(env, home, cwd=cwd) is None


def test_identity_loads_and_trims_end(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    (home / "id.md").write_text("  You are Ada.\n\n")
    assert load_identity({"QWEN_SYSTEM_IDENTITY_MD": "~/id.md"}, home) == "  You are Ada."
    (cwd / "rel.md").write_text("Rel.")
    assert load_identity({"QWEN_SYSTEM_IDENTITY_MD": "rel.md"}, home, cwd=cwd) == "Rel."


def test_identity_errors(dirs: tuple[Path, Path]) -> None:
    cwd, home = dirs
    with pytest.raises(SystemIdentityFileError) as missing:
        load_identity({"QWEN_SYSTEM_IDENTITY_MD": "~/none.md"}, home)
    assert str(missing.value) == f"missing system identity file '{home / 'none.md'}'"
    assert missing.value.reason == "missing"

    (home / "blank.md").write_text(" \n\t\n")
    with pytest.raises(SystemIdentityFileError) as empty:
        load_identity({"QWEN_SYSTEM_IDENTITY_MD": "~/blank.md"}, home)
    assert str(empty.value) == f"empty system identity file '{home / 'blank.md'}'"

    with pytest.raises(SystemIdentityFileError) as unresolved:
        load_identity({"QWEN_SYSTEM_IDENTITY_MD": "~/id.md"}, None)
    assert str(unresolved.value) == "failed to resolve system identity path '~/id.md'"
    with pytest.raises(SystemIdentityFileError, match="failed to resolve"):
        load_identity({"QWEN_SYSTEM_IDENTITY_MD": "rel.md"}, home)  # relative, no cwd

    messages = {str(missing.value), str(empty.value), str(unresolved.value)}
    assert len(messages) == 3
    assert all(e.value.to_wire()["code"] == -32010 for e in (missing, empty, unresolved))
