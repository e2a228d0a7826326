"""Parse one ``SKILL.md`` into a :class:`Skill` plus the problems found; never raises.

Required frontmatter: ``name`` and ``description``. Optional: ``paths``, ``allowed-tools``,
``model``, ``argument-hint``, ``when_to_use``, ``disable-model-invocation``,
``user-invocable``, ``priority`` (reference/qwen-code-facts.md §4.2). Unknown keys (``hooks``,
``license``, …) are ignored.

Decisions:
- The frontmatter ``name`` is the skill's name, as in Qwen Code; a name that differs from the
  directory name is accepted without a report (skill repos often use a versioned or prefixed
  directory name, and the name the model sees is the declared one).
- Names must be 1–64 characters of lowercase letters, digits, ``-``, ``_`` and ``.``, starting
  with a letter or digit: the name flows into tool calls, reminders and file paths, so ``..``,
  spaces, slashes and markup are refused (the skill is not loaded).
- A bad *optional* field is reported and ignored; the skill still loads. A bad glob in
  ``paths`` drops only that pattern, keyed ``"{SKILL.md}#paths[{pattern}]"``.
- SKILL.md files over :data:`MAX_SKILL_BYTES` are refused rather than truncated: a cut-off
  procedure is worse than none.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from qwenctxd import frontmatter
from qwenctxd.fsutil import open_regular
from qwenctxd.instructions.rules import compile_patterns
from qwenctxd.skills.model import Level, Skill, SkillError

MAX_SKILL_BYTES = 256 * 1024
OVERSIZE_MESSAGE = f"SKILL.md is larger than {MAX_SKILL_BYTES // 1024} KiB; not loaded"
MAX_NAME_LEN = 64
NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_TRUE = {"true", "yes", "on"}
_FALSE = {"false", "no", "off"}


def validate_name(name: object) -> str | None:
    """None when ``name`` is a valid skill name, else the reason it is not."""
    if isinstance(name, bool | int | float):
        return f"name must be a string, not {type(name).__name__} (quote it in the YAML)"
    if not isinstance(name, str):
        return f"name must be a string, not {type(name).__name__}"
    if not name:
        return "name is empty"
    if len(name) > MAX_NAME_LEN:
        return f"name is {len(name)} characters, over the limit of {MAX_NAME_LEN}"
    if not NAME_RE.fullmatch(name):
        return (
            f"name {name!r} is not allowed: use lowercase letters, digits, '-', '_' and '.', "
            "starting with a letter or digit"
        )
    return None


def split_tools(value: str) -> list[str]:
    """Split ``"Read, Grep"`` or ``"Read Grep Bash(git status:*)"`` into tool entries.

    Commas and whitespace separate entries except inside parentheses, so a permission
    pattern such as ``Bash(git diff:*)`` stays whole.
    """
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in value:
        if ch == "(":
            depth += 1
        elif ch == ")" and depth:
            depth -= 1
        if depth == 0 and (ch == "," or ch.isspace()):
            if cur:
                out.append("".join(cur))
                cur = []
            continue
        cur.append(ch)
    if cur:
        out.append("".join(cur))
    return out


def read_skill_text(path: Path) -> tuple[str | None, list[SkillError]]:
    """Read SKILL.md with the size cap; (text, []) or (None, [error])."""
    key = str(path)
    try:
        with open_regular(path) as fh:
            raw = fh.read(MAX_SKILL_BYTES + 1)
    except OSError as exc:
        return None, [SkillError(key, f"cannot read SKILL.md: {exc.strerror or exc}")]
    if len(raw) > MAX_SKILL_BYTES:
        return None, [SkillError(key, OVERSIZE_MESSAGE)]
    return raw.decode("utf-8", errors="replace"), []


def parse_skill(
    path: Path, level: Level, *, text: str | None = None
) -> tuple[Skill | None, list[SkillError]]:
    """Parse the SKILL.md at ``path`` (or ``text`` when given) into (skill or None, errors)."""
    key = str(path)
    try:
        if text is None:
            text, errors = read_skill_text(path)
            if text is None:
                return None, errors
        elif len(text.encode("utf-8", errors="replace")) > MAX_SKILL_BYTES:
            return None, [SkillError(key, OVERSIZE_MESSAGE)]
        return _parse_text(path, level, text)
    except Exception as exc:  # pragma: no cover - defensive: one bad file must not abort a scan
        return None, [SkillError(key, f"unexpected error while parsing: {exc!r}")]


def _parse_text(path: Path, level: Level, text: str) -> tuple[Skill | None, list[SkillError]]:
    key = str(path)
    fm = frontmatter.parse(text)
    if not fm.present:
        return None, [SkillError(key, "missing YAML frontmatter (a --- block at the top)")]
    if fm.error:
        return None, [SkillError(key, fm.error)]
    data = fm.data
    errors: list[SkillError] = []

    name = data.get("name")
    if name is None:
        errors.append(SkillError(key, "missing required field: name"))
    else:
        if isinstance(name, str):
            name = name.strip()
        problem = validate_name(name)
        if problem:
            errors.append(SkillError(key, problem))

    description = data.get("description")
    if description is None:
        errors.append(SkillError(key, "missing required field: description"))
    elif not isinstance(description, str):
        errors.append(
            SkillError(key, f"description must be a string, not {type(description).__name__}")
        )
    elif not description.strip():
        errors.append(SkillError(key, "description is empty"))
    if errors:
        return None, errors
    assert isinstance(name, str) and isinstance(description, str)

    def opt_str(field: str, value: Any) -> str | None:
        if value is None:
            return None
        if isinstance(value, str):
            return value.strip() or None
        errors.append(SkillError(key, f"{field} must be a string; ignored"))
        return None

    hint_raw = data.get("argument-hint")
    if isinstance(hint_raw, list) and all(isinstance(x, str | int | float) for x in hint_raw):
        # ``argument-hint: [file]`` is YAML for a list; show it the way the author wrote it.
        hint_raw = " ".join(f"[{x}]" for x in hint_raw)
    argument_hint = opt_str("argument-hint", hint_raw)
    model = opt_str("model", data.get("model"))
    when_raw = data.get("when_to_use", data.get("when-to-use"))
    when_to_use = opt_str("when_to_use", when_raw)

    allowed_tools: tuple[str, ...] = ()
    tools_raw = data.get("allowed-tools")
    if isinstance(tools_raw, str):
        allowed_tools = tuple(split_tools(tools_raw))
    elif isinstance(tools_raw, list):
        good_tools = [t.strip() for t in tools_raw if isinstance(t, str) and t.strip()]
        if len(good_tools) != len(tools_raw):
            errors.append(SkillError(key, "allowed-tools: non-string entries ignored"))
        allowed_tools = tuple(good_tools)
    elif tools_raw is not None:
        errors.append(SkillError(key, "allowed-tools must be a list or a string; ignored"))

    disable_model_invocation = _flag(
        data.get("disable-model-invocation"), False, "disable-model-invocation", key, errors
    )
    user_invocable = _flag(data.get("user-invocable"), True, "user-invocable", key, errors)

    priority: float | None = None
    prio_raw = data.get("priority")
    if isinstance(prio_raw, int | float) and not isinstance(prio_raw, bool):
        if prio_raw != prio_raw or prio_raw in (float("inf"), float("-inf")):
            errors.append(SkillError(key, "priority must be a finite number; ignored"))
        else:
            priority = float(prio_raw)
    elif prio_raw is not None:
        errors.append(SkillError(key, "priority must be a number; ignored"))

    paths, matcher = _parse_paths(data.get("paths"), key, errors)

    skill = Skill(
        name=name,
        description=description.strip(),
        level=level,
        path=path,
        base_dir=path.parent,
        body=fm.body.strip(),
        paths=paths,
        allowed_tools=allowed_tools,
        model=model,
        argument_hint=argument_hint,
        when_to_use=when_to_use,
        disable_model_invocation=disable_model_invocation,
        user_invocable=user_invocable,
        priority=priority,
        matcher=matcher,
    )
    return skill, errors


def _flag(value: Any, default: bool, field: str, key: str, errors: list[SkillError]) -> bool:
    """A boolean field: YAML booleans or the strings true/false (any case)."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE:
        return True
    if isinstance(value, str) and value.strip().lower() in _FALSE:
        return False
    errors.append(SkillError(key, f"{field} must be true or false; ignored"))
    return default


def _parse_paths(
    value: Any, key: str, errors: list[SkillError]
) -> tuple[tuple[str, ...], object | None]:
    """(declared string patterns, matcher of the valid ones); each bad glob reported alone."""
    if value is None:
        return (), None
    if isinstance(value, str):
        patterns: list[Any] = [value]
    elif isinstance(value, list):
        patterns = value
    else:
        errors.append(SkillError(key, "paths must be a glob or a list of globs; ignored"))
        return (), None
    matcher, good, problems = compile_patterns(patterns, key)
    good_set = set(good)
    bad = [p for p in patterns if not (isinstance(p, str) and p in good_set)]
    for pat, problem in zip(bad, problems, strict=False):
        shown = pat if isinstance(pat, str) else repr(pat)
        prefix = f"{key}#paths[{pat}]: "
        message = problem[len(prefix):] if problem.startswith(prefix) else problem
        if not isinstance(pat, str) or not pat.strip():
            message = "not a non-empty string"
        errors.append(SkillError(f"{key}#paths[{shown}]", f"invalid glob dropped: {message}"))
    declared = tuple(p for p in patterns if isinstance(p, str) and p.strip())
    return declared, matcher
