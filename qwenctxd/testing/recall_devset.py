"""The multilingual recall dev set (``bench/recall_devset/``): load it, lay it out as Qwen Code
would on disk, and map memory ids to and from the paths the daemon reports.

The set is hand-written: memories under ``memories/<scope key>/<type>/<slug>.md`` where the scope
key is a project (``harbor``, ``lumen``, ``ferrite``) or ``user``; queries in ``queries.json``.
A memory's *id* is ``<scope key>/<type>/<slug>`` (``lumen/project/staging-deploy``).

* :func:`load` — parse the set (memories through the daemon's own :func:`store.scan`).
* :func:`materialize` — write the memories into a HOME in Qwen Code's real layout: the user
  scope under ``~/.qwen/memories/``, each project's memory under
  ``~/.qwen/projects/<slug(cwd)>/memory/`` with a working directory ``~/src/<key>`` holding a
  ``.git`` directory so the daemon resolves it as a project. Returns each project's cwd.
* :class:`Layout` — memory id <-> materialized file path, both ways.
* :func:`content_tokens` / :func:`shared_content` — what "a paraphrase shares no content word
  with its memory" means, for the checker test and the harness.

Scope rule: a query asked in project P may be answered by P's memories and the user's, never by
another project's.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from qwenctxd.memory import store
from qwenctxd.memory.lexical import STOP_WORDS
from qwenctxd.memory.paths import (
    ENV_BASE_DIR,
    QWEN_DIRNAME,
    project_memory_root,
    user_memory_root,
)
from qwenctxd.memory.tokenize import tokens

DEVSET_DIR = Path(__file__).resolve().parents[2] / "bench" / "recall_devset"
PROJECTS: tuple[str, ...] = ("harbor", "lumen", "ferrite")
USER_SCOPE = "user"
SCOPE_KEYS: tuple[str, ...] = (*PROJECTS, USER_SCOPE)
LANGS: tuple[str, ...] = ("en", "zh", "ja", "mixed")
KINDS: tuple[str, ...] = ("overlap", "paraphrase")
SPLITS: tuple[str, ...] = ("tune", "heldout")
#: deterministic mtimes for materialized files (the lexical tie-break is "newer first")
BASE_MTIME = 1_780_000_000.0

Lang = Literal["en", "zh", "ja", "mixed"]

_KANA = re.compile("[\u3041-\u30ff]")
_HAN = re.compile("[\u4e00-\u9fff]")
_HIRAGANA_ONLY = re.compile("[\u3041-\u309f]+")

# Words that carry no topic in a query (on top of the lexical tier's own stop words). Kept
# short on purpose: everything else counts as content.
EXTRA_STOP_WORDS = frozenset(
    """
    the and for are how what who whom which does did doing done our ours any get got
    again still ever there thing things stuff okay know tell show give make made
    one way new use using used
    我们 你们 他们 什么 怎么 哪个 哪里 哪些 多少 是否 是不 还有 这里 那里 一下 的是 不能 能不
    可以 要不 是什 么时 有什 吗
    """.split()
)


def is_stop(token: str) -> bool:
    """A token that is not a content word: a stop word, or a bigram of hiragana only
    (particles and inflections: ``して`` ``ます`` ``には``) — Japanese content words are
    carried by kanji and katakana, so ``の色`` or ``消え`` still count as content."""
    if token in STOP_WORDS or token in EXTRA_STOP_WORDS:
        return True
    return len(token) <= 2 and bool(_HIRAGANA_ONLY.fullmatch(token))


def content_tokens(text: str) -> set[str]:
    """The content tokens of ``text`` under the recall tokenizer (:func:`tokens`)."""
    return {t for t in tokens(text) if not is_stop(t)}


def _related(q: str, m: str) -> bool:
    """Whether query token ``q`` matches memory token ``m``: equal, or (Latin) sharing a prefix
    of at least 4 characters that is at most 2 short of the shorter token — ``deploy`` /
    ``deployment``, ``tests`` / ``test``, ``library`` / ``libraries`` (a crude stemmer that
    errs on the side of calling words related)."""
    if q == m:
        return True
    if _HAN.search(q) or _KANA.search(q) or _HAN.search(m) or _KANA.search(m):
        return False
    common = len(os.path.commonprefix([q, m]))
    return common >= 4 and common >= min(len(q), len(m)) - 2


def shared_content(query: str, memory_text: str) -> set[str]:
    """The query's content tokens that the memory text also has (by :func:`_related`)."""
    mem = content_tokens(memory_text)
    return {q for q in content_tokens(query) if any(_related(q, m) for m in mem)}


def text_lang(text: str) -> Lang:
    """``ja`` with kana, ``zh`` with Han and no kana, else ``en``."""
    if _KANA.search(text):
        return "ja"
    if _HAN.search(text):
        return "zh"
    return "en"


@dataclass(frozen=True)
class Memory:
    id: str
    scope_key: str  # a project key or "user"
    type: str
    name: str
    description: str
    body: str
    keywords: tuple[str, ...]
    source: Path

    @property
    def text(self) -> str:
        """Everything a ranker may read: name, description, keywords, body."""
        return "\n".join((self.name, self.description, " ".join(self.keywords), self.body))

    @property
    def lang(self) -> Lang:
        return text_lang(self.text)


@dataclass(frozen=True)
class Query:
    id: str
    query: str
    lang: Lang
    project: str
    kind: str  # "overlap" | "paraphrase"
    relevant: tuple[str, ...]
    split: str  # "tune" | "heldout"
    note: str = ""


@dataclass
class DevSet:
    root: Path
    memories: dict[str, Memory]
    queries: list[Query]

    def visible(self, project: str) -> list[Memory]:
        """The memories a query in ``project`` may see: the project's and the user's."""
        return [m for m in self.memories.values() if m.scope_key in (project, USER_SCOPE)]

    def in_scope(self, memory_id: str, project: str) -> bool:
        m = self.memories.get(memory_id)
        return m is not None and m.scope_key in (project, USER_SCOPE)


def _memory_id(scope_key: str, relative_path: str) -> str:
    return f"{scope_key}/{relative_path.removesuffix('.md')}"


def load(root: Path = DEVSET_DIR) -> DevSet:
    """Parse the set: every memory file (through :func:`store.scan`) and every query."""
    memories: dict[str, Memory] = {}
    for key in SCOPE_KEYS:
        result = store.scan(root / "memories" / key, "project", uncapped=True)
        if result.problems:
            raise ValueError(f"bad memory files in {key}: {result.problems}")
        for doc in result.docs:
            mid = _memory_id(key, doc.relative_path)
            memories[mid] = Memory(id=mid, scope_key=key, type=doc.type, name=doc.name,
                                   description=doc.description, body=doc.body,
                                   keywords=tuple(doc.keywords), source=doc.path)
    raw = json.loads((root / "queries.json").read_text(encoding="utf-8"))
    queries = [Query(id=q["id"], query=q["query"], lang=q["lang"], project=q["project"],
                     kind=q["kind"], relevant=tuple(q["relevant"]), split=q["split"],
                     note=q.get("note", "")) for q in raw]
    return DevSet(root=root, memories=memories, queries=queries)


# -- the on-disk layout --------------------------------------------------------------------------


def _environ(home: Path) -> Mapping[str, str]:
    """An environment that resolves memory roots as a daemon with ``HOME=home`` (and no
    ``QWEN_HOME`` / ``QWEN_RUNTIME_DIR``) does: its memory base dir is ``home/.qwen``."""
    return {"HOME": str(home), ENV_BASE_DIR: str(home / QWEN_DIRNAME)}


@dataclass
class Layout:
    """Where each memory of the set lives under one HOME, and the way back."""

    home: Path
    cwds: dict[str, Path] = field(default_factory=dict)
    files: dict[str, Path] = field(default_factory=dict)  # memory id -> file

    def __post_init__(self) -> None:
        self.home = Path(os.path.realpath(self.home))
        env = _environ(self.home)
        self.cwds = {p: self.home / "src" / p for p in PROJECTS}
        self.roots = {p: project_memory_root(cwd, env) for p, cwd in self.cwds.items()}
        self.roots[USER_SCOPE] = user_memory_root(env)
        self._by_path: dict[str, str] = {}

    def root_of(self, scope_key: str) -> Path:
        return self.roots[scope_key]

    def path_of(self, memory_id: str) -> Path:
        """The file a memory id is materialized as (whether or not it was written yet)."""
        scope_key, rest = memory_id.split("/", 1)
        return self.roots[scope_key] / f"{rest}.md"

    def id_of(self, path: str | os.PathLike[str]) -> str | None:
        """The memory id of a path the daemon reports, None for a file not of the set."""
        real = os.path.realpath(os.fspath(path))
        if real in self._by_path:
            return self._by_path[real]
        for key, root in self.roots.items():
            r = os.path.realpath(root)
            if real.startswith(r + os.sep) and real.endswith(".md"):
                return _memory_id(key, os.path.relpath(real, r).replace(os.sep, "/"))
        return None

    def ids_of(self, paths: Iterable[str | os.PathLike[str]]) -> list[str]:
        """Paths mapped to ids, files not of the set dropped, order kept."""
        return [i for p in paths if (i := self.id_of(p)) is not None]


def materialize(home: Path, devset: DevSet | None = None) -> dict[str, Path]:
    """Write the set's memories into ``home`` in Qwen Code's layout; returns each project's cwd
    (a directory with a ``.git`` directory, so the daemon resolves it as a project root).

    Files get deterministic mtimes (one minute apart, in id order) so "newer first" tie-breaks
    are the same on every run. The ``MEMORY.md`` indexes are left for the daemon's scaffold.
    """
    return materialize_layout(home, devset).cwds


def materialize_layout(home: Path, devset: DevSet | None = None) -> Layout:
    """:func:`materialize`, returning the whole :class:`Layout` (cwds and id <-> path)."""
    devset = devset or load()
    layout = Layout(home)
    for cwd in layout.cwds.values():
        (cwd / ".git").mkdir(parents=True, exist_ok=True)
    for i, mid in enumerate(sorted(devset.memories)):
        mem = devset.memories[mid]
        dst = layout.path_of(mid)
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(mem.source.read_bytes())
        stamp = BASE_MTIME + 60.0 * i
        os.utime(dst, (stamp, stamp))
        layout.files[mid] = dst
        layout._by_path[os.path.realpath(dst)] = mid
    return layout


def scanned_docs(layout: Layout) -> dict[str, list[store.MemoryDoc]]:
    """The materialized memories as the daemon parses them, per scope key."""
    docs: dict[str, list[store.MemoryDoc]] = {}
    for key in (*PROJECTS, USER_SCOPE):
        scope = "user" if key == USER_SCOPE else "project"
        res = store.scan(layout.root_of(key), scope, uncapped=True)  # type: ignore[arg-type]
        assert not res.problems, res.problems
        docs[key] = res.docs
    return docs
