"""Wire types of the ``skills.*`` methods."""

from __future__ import annotations

import msgspec

from qwenctxd.protocol.daemon import Params


class ListParams(Params):
    cwd: str
    session_id: str | None = None


class SkillInfo(msgspec.Struct, kw_only=True):
    name: str
    description: str
    level: str
    path: str
    conditional: bool
    active: bool
    paths: list[str] = msgspec.field(default_factory=list)
    model_invocable: bool = True


class SkillError(msgspec.Struct, kw_only=True):
    path: str
    message: str


class ListResult(msgspec.Struct, kw_only=True):
    skills: list[SkillInfo]
    errors: list[SkillError]
    shadowed: list[SkillInfo] = msgspec.field(default_factory=list)


class LoadParams(Params):
    cwd: str
    name: str
    session_id: str | None = None


class LoadResult(msgspec.Struct, kw_only=True):
    name: str
    base_dir: str
    content: str
