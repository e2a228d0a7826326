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


# -- skills.review.* (skill review drafts) ----------------------------------------------------
class ReviewListParams(Params):
    cwd: str


class DraftInfo(msgspec.Struct, kw_only=True):
    id: str
    name: str
    description: str
    path: str
    created_at: float
    updates_existing: bool
    session_id: str | None = None
    problem: str | None = None


class ReviewListResult(msgspec.Struct, kw_only=True):
    drafts: list[DraftInfo]


class ReviewDraftParams(Params):
    cwd: str
    draft_id: str


class ReviewAcceptResult(msgspec.Struct, kw_only=True):
    path: str


class ReviewDiscardResult(msgspec.Struct, kw_only=True):
    ok: bool


class ReviewRunParams(Params):
    session_id: str


class ReviewRunResult(msgspec.Struct, kw_only=True):
    scheduled: bool
    reason: str | None = None
