"""Handlers of ``prompt.system`` and ``instructions.*`` (files, add_memory)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import anyio

from qwenctxd.instructions import add_memory as memory_file
from qwenctxd.instructions import tool_roles
from qwenctxd.instructions.discovery import normalize_filenames
from qwenctxd.instructions.rules import relative_to_root, rule_reminder
from qwenctxd.project import Project, ProjectRegistry
from qwenctxd.project.registry import NAME_MAX, anchor_id_fits, project_id_fits
from qwenctxd.protocol import errors, methods
from qwenctxd.protocol import instructions as wire
from qwenctxd.server.dispatch import handler
from qwenctxd.skills.listing import SKILL_TOOL

if TYPE_CHECKING:
    from qwenctxd.instructions.service import InstructionsService
    from qwenctxd.server.connection import Connection


def checked_cwd(value: str, field: str = "cwd") -> Path:
    """An absolute, existing directory, or InvalidParams naming ``field``."""
    path = _existing_dir(value, field)
    # The project's state lives in ONE directory named after its root (Qwen Code's project
    # id): a root whose id passes NAME_MAX has nowhere to keep sessions or memory.
    if not project_id_fits(path):
        raise _name_too_long(field)
    return path


def checked_project(projects: ProjectRegistry, value: str,
                    field: str = "cwd") -> tuple[Path, Project]:
    """:func:`checked_cwd`, and the project it belongs to: resolved once, here at the wire
    edge, and handed to every service the request reaches."""
    cwd = _existing_dir(value, field)
    project = projects.get(cwd)
    if not anchor_id_fits(project.anchor):
        raise _name_too_long(field)
    return cwd, project


def _existing_dir(value: str, field: str) -> Path:
    if not value or not os.path.isabs(value):
        raise errors.InvalidParams(f"{field} must be an absolute path",
                                   data={"field": field, "message": "not absolute"})
    path = Path(os.path.normpath(value))
    with errors.client_path(field):
        is_dir = path.is_dir()
    if not is_dir:
        raise errors.InvalidParams(f"{field} is not an existing directory: {value}",
                                   data={"field": field, "message": "no such directory"})
    return path


def _name_too_long(field: str) -> errors.InvalidParams:
    return errors.InvalidParams(
        f"{field}: the project path is too long for a project id ({NAME_MAX} bytes)",
        data={"field": field, "message": "name too long", "errno": "ENAMETOOLONG"})


def _problems(problems: list) -> list[wire.Problem]:  # type: ignore[type-arg]
    return [wire.Problem(path=str(p.path), kind=p.kind, message=p.message) for p in problems]


class InstructionsHandlers:
    def __init__(self, *, instructions: InstructionsService, projects: ProjectRegistry) -> None:
        self.instructions = instructions
        self.projects = projects

    @handler(methods.PROMPT_SYSTEM)
    async def prompt_system(self, ctx: Connection, p: wire.PromptSystemParams
                            ) -> wire.PromptSystemResult:
        cwd, project = checked_project(self.projects, p.cwd)
        roles = tool_roles.classify([*p.tools, SKILL_TOOL]) if p.tools is not None else None
        agent = (p.agent or {}).get("name")
        sp = await self.instructions.system_prompt(
            project, cwd, model=p.model, append=p.append, interaction_mode=p.interaction_mode, env=p.env,
            tool_roles=roles, agent=agent if isinstance(agent, str) else None)
        return wire.PromptSystemResult(
            text=sp.text,
            sections=[wire.Section(name=n, chars=c, est_tokens=t, omitted=c == 0)
                      for n, c, t in sp.sections],
            files=[wire.PromptFile(path=path, type=kind) for path, kind in sp.files],
            prefix_hash=sp.prefix_hash,
            project_root=str(sp.project_root) if sp.project_root else None,
            errors=_problems(sp.problems),
        )

    @handler(methods.INSTRUCTIONS_FILES)
    async def files(self, ctx: Connection, p: wire.CwdParams) -> wire.InstructionsFilesResult:
        cwd, project = checked_project(self.projects, p.cwd)
        inst = await self.instructions.instruction_set(project, cwd)
        rules = [
            wire.RuleInfo(path=str(r.path), conditional=False, paths=[], bytes=len(r.body))
            for r in inst.rules.baseline
        ] + [
            wire.RuleInfo(path=str(r.path), conditional=True, paths=list(r.patterns),
                          bytes=len(r.body))
            for r in inst.rules.conditional
        ]
        return wire.InstructionsFilesResult(
            files=[
                wire.FileInfo(path=str(f.path), type=f.type, imports=[str(i) for i in f.imports],
                              bytes=f.bytes, truncated=f.truncated)
                for f in inst.files
            ],
            errors=_problems(inst.problems),
            rules=rules,
            project_root=str(inst.project_root) if inst.project_root else None,
        )

    @handler(methods.INSTRUCTIONS_ADD_MEMORY)
    async def add_memory(self, ctx: Connection, p: wire.AddMemoryParams) -> wire.AddMemoryResult:
        cwd, project = checked_project(self.projects, p.cwd)
        try:
            memory_file.bullet(p.text)
        except ValueError:
            raise errors.InvalidParams("text is empty (nothing left after list markers)",
                                       data={"field": "text", "message": "empty"}) from None
        name = normalize_filenames(project.settings.context.file_name)[0]
        if p.scope == "global":
            target, field = project.qwen_home / name, "scope"
        else:
            field = "cwd"
            try:
                with errors.client_path(field):
                    target = memory_file.project_target(
                        cwd, name, git_root=project.root, home=project.home,
                        qwen_home=project.qwen_home)
            except memory_file.NotInProject as exc:
                raise errors.InvalidParams(str(exc), data={
                    "field": "cwd", "message": "not inside a project"}) from None
        with errors.client_path(field):  # e.g. QWEN.md is a directory
            path = await anyio.to_thread.run_sync(memory_file.add_memory, target, p.text)
        self.instructions.invalidate_path(path)
        return wire.AddMemoryResult(path=str(path))

    @handler(methods.INSTRUCTIONS_MATCH_RULES)
    async def match_rules(self, ctx: Connection, p: wire.MatchRulesParams
                          ) -> wire.MatchRulesResult:
        cwd, project = checked_project(self.projects, p.cwd)
        inst = await self.instructions.instruction_set(project, cwd)
        root = inst.project_root or cwd
        out = []
        for rule in inst.rules.conditional:
            matched = []
            for raw in p.paths:
                rel = relative_to_root(raw if os.path.isabs(raw) else cwd / raw, root)
                if rel is not None and rule.matches(rel):
                    matched.append(rel)
            if matched:
                out.append(wire.MatchedRule(
                    path=str(rule.path), paths=list(rule.patterns), matched=matched,
                    reminder=rule_reminder(rule.path, root, rule.body)))
        return wire.MatchRulesResult(rules=out)
