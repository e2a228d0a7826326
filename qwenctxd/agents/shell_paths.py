"""Where a read-only shell command reads: every path it names must be one the agent may read.

:mod:`qwenctxd.agents.shell_readonly` proves a command cannot write; this module proves it
does not read what an agent must not (:class:`~qwenctxd.agents.permissions.ReadScope`: outside
the read roots, or a credential file anywhere). It walks the same tree-sitter-bash AST and
expands each argument of every command — in pipelines, lists, loops, substitutions and nested
``bash -c`` scripts — the way bash will: quotes removed, ``~`` and ``$HOME``/``${HOME}`` (and
the other variables of the agent shell's fixed environment) substituted, braces expanded, globs
matched against the disk, then judged through the one containment rule (``..`` folded, symlinks
followed). An argument is also judged in its pieces (words of a script such as sed's
``1r /etc/passwd``, the value after ``=`` or ``:`` as in ``--file=…`` and ``HEAD:.env``, an
attached option value such as ``-f/path``), and ``< file`` redirections are judged too.

It fails closed. An argument of a file-reading command whose value bash computes at run time (a
command substitution, an unknown variable, arithmetic) is refused, as is ``xargs`` (its
arguments arrive on stdin), ``git grep``, sed's ``r``/``R`` file commands, awk's ``getline``
and ``ARGV``, and jq modules. A recursive content search (``grep -r``, ``rg``, ``ag``,
``diff -r``) walks the directories it would read and is refused when one of them holds a
credential file or a link out of the roots (``grep_search`` skips those files instead).
Commands that print only their arguments or metadata (``echo``, ``test``, ``basename``…) are
not judged. File names are not secret; listings (``ls``, ``find``, ``tree``) are judged only for
leaving the roots.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import bracex
from tree_sitter import Node
from wcmatch import glob as wglob

from qwenctxd.agents.permissions import ReadScope
from qwenctxd.agents.shell_readonly import node_source, parse_script, word_arg
from qwenctxd.agents.shell_rules import Refuse, check_sed, inner_shell_script, scan_options

__all__ = ["shell_read_refusal"]

_MAX_DEPTH = 4
_MAX_ALTERNATIVES = 256
_MAX_WALK = 20_000
_DEV_OK = frozenset({"/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr"})
_NON_READING = frozenset(
    "echo printf true false : pwd which type basename dirname seq uname whoami id ps uptime "
    "free nproc printenv date hostname test [ tr realpath readlink".split())
_SHELLS = frozenset({"bash", "sh", "dash"})
_GREPS = {"grep": "efmABCdD", "egrep": "efmABCdD", "fgrep": "efmABCdD",
          "rg": "ABCefgjmMrtTEd", "ag": "ABCGgmp"}
_GLOB_CHARS = re.compile(r"(?<!\\)(?:\\\\)*[*?\[]")
_SPECIAL = re.compile(r"([\\*?\[\]{},~])")
_AWK_READS = re.compile(r"\b(getline|ARGV|ARGC)\b")
_JQ_MODULES = re.compile(r"\b(import|include|modulemeta|get_search_list)\b")
_GLOB_FLAGS = wglob.BRACE | wglob.NOUNIQUE


class _Unknown(Exception):
    """A value bash computes at run time."""


@dataclass(frozen=True)
class _Env:
    cwd: Path
    scope: ReadScope
    vars: Mapping[str, str]

    @property
    def home(self) -> str:
        return self.vars.get("HOME") or os.path.expanduser("~")


def _esc(text: str) -> str:
    return _SPECIAL.sub(r"\\\1", text)


def _unesc(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text, flags=re.S)


def _var(name: str, env: _Env) -> str:
    if name == "PWD":
        return str(env.cwd)
    if name in env.vars:
        return env.vars[name]
    raise _Unknown(f"${name}")


def _raw(node: Node, env: _Env) -> str:
    """The word as a pattern: unquoted text as written, quoted text and variable values
    escaped; raises _Unknown for what only bash can compute."""
    t = node.type
    if t in ("word", "number"):
        return node_source(node)
    if t == "raw_string":
        return _esc(node_source(node)[1:-1])
    if t == "ansi_c_string" and "\\" not in node_source(node):
        return _esc(node_source(node)[2:-1])
    if t == "simple_expansion":
        return _esc(_var(node_source(node)[1:], env))
    if t == "expansion":
        kids = node.children
        if len(kids) == 3 and kids[1].type == "variable_name":
            return _esc(_var(node_source(kids[1]), env))
        raise _Unknown(node_source(node))
    if t == "process_substitution":
        return "/dev/fd/63"
    if t == "string":
        data, base = node.text or b"", node.start_byte
        out, pos = [], base + 1
        for c in node.named_children:
            out.append(_esc(re.sub(r'\\([$`"\\\n])', r"\1",
                                   data[pos - base:c.start_byte - base].decode())))
            out.append(_esc(_unesc(node_source(c))) if c.type == "string_content"
                       else _raw(c, env))
            pos = c.end_byte
        out.append(_esc(data[pos - base:len(data) - 1].decode()))
        return "".join(out)
    if t == "concatenation":
        return "".join(_raw(c, env) if c.is_named else node_source(c) for c in node.children)
    raise _Unknown(node_source(node)[:40])


def _values(node: Node, env: _Env) -> list[str]:
    """Every string the argument may become (braces, ``~``, globs expanded)."""
    raw = _raw(node, env)
    try:
        alts = bracex.expand(raw, keep_escapes=True, limit=_MAX_ALTERNATIVES)
    except Exception as exc:  # noqa: BLE001 - too many alternatives, or bad braces
        raise Refuse(f"argument {node_source(node)[:60]!r} expands to too many words") from exc
    out: list[str] = []
    for alt in alts:
        if alt.startswith("~"):
            head, sep, rest = alt.partition("/")
            if head != "~":
                raise _Unknown(head)  # ~user, ~+, ~-
            alt = _esc(env.home) + sep + rest
        if _GLOB_CHARS.search(alt):
            matches = wglob.glob(alt, root_dir=str(env.cwd), flags=_GLOB_FLAGS,
                                 limit=_MAX_WALK)
            out.append(_unesc(alt))
            out.extend(m if os.path.isabs(m) else str(env.cwd / m) for m in matches)
        else:
            out.append(_unesc(alt))
    return out


def _pieces(value: str) -> Iterator[str]:
    """The value, then the paths it may hold inside: script words, option values after
    ``=``, ``:``-separated parts (``HEAD:.env``; not a URL's ``//host``), ``-fPATH``."""
    yield value
    for word in value.split():
        yield word
        if word.startswith("-") and not word.startswith("--") and len(word) > 2:
            yield word[2:]
        for sep in "=:":
            for part in word.split(sep)[1:]:
                if part and not part.startswith("//"):
                    yield part


def _judge_path(piece: str, shown: str, env: _Env) -> None:
    if piece in _DEV_OK or piece.startswith("/dev/fd/"):
        return
    if piece.startswith("~"):
        head, sep, rest = piece.partition("/")
        if head != "~":
            raise Refuse(f"{shown!r} names another user's home")
        piece = env.home + sep + rest
    path = piece if os.path.isabs(piece) else os.path.join(env.cwd, piece)
    why = env.scope.refusal(path)
    if why is not None:
        raise Refuse(f"argument {shown!r}: {why}")


def _walk_check(directory: str, env: _Env, follow: bool) -> None:
    """Refuse when the search would read a file the agent may not; links inside the tree
    count only when the search follows them (``grep -R``, ``rg -L``, ``diff -r``)."""
    seen = 0
    for dirpath, dirnames, filenames in os.walk(directory):
        for name in (*dirnames, *filenames):
            if not follow and os.path.islink(os.path.join(dirpath, name)):
                continue
            seen += 1
            if seen > _MAX_WALK:
                raise Refuse("a recursive search over more than "
                              f"{_MAX_WALK} entries cannot be checked; use grep_search")
            why = env.scope.refusal(os.path.join(dirpath, name))
            if why is not None:
                raise Refuse(f"the recursive search would read "
                              f"{os.path.join(dirpath, name)}: {why}; use grep_search (it "
                              "skips such files) or name the directories to search")


def _follows(name: str, args: list[Node]) -> bool:
    """Whether a recursive search follows links found inside the tree."""
    texts = [word_arg(a).text or "" for a in args]
    short = "".join(t[1:] for t in texts if t.startswith("-") and not t.startswith("--"))
    if name == "diff":
        return True
    if name in ("rg", "ag"):
        return "L" in short or "f" in short and name == "ag" or "--follow" in texts
    return "R" in short or "--dereference-recursive" in texts


def _recursive_dirs(name: str, args: list[Node], values: list[list[str]], env: _Env
                    ) -> list[str]:
    """The directories a recursive content search (grep -r, rg, ag, diff -r) reads."""
    lits = [word_arg(a) for a in args]
    texts = [a.text or "" for a in lits]
    short = "".join(t[1:] for t in texts if t.startswith("-") and not t.startswith("--"))
    if name == "diff":
        if "r" not in short and "--recursive" not in texts:
            return []
        picked = list(range(len(args)))
    elif name in _GREPS:
        if not (name in ("rg", "ag") or "r" in short or "R" in short or any(
                t in ("--recursive", "--dereference-recursive", "--directories=recurse",
                      "recurse") for t in texts)):
            return []
        try:
            opts, pos = scan_options(name, lits, takes=_GREPS[name],
                                 long_takes=("regexp", "file", "max-count", "context"))
        except Refuse:
            opts, pos = [], lits
        operands = pos if any(k in ("e", "f", "regexp", "file") for k, _ in opts) else pos[1:]
        picked = [i for i, a in enumerate(lits) if any(a is p for p in operands)]
        if not picked:
            return [str(env.cwd)]
    else:
        return []
    found = []
    for i in picked:
        for v in values[i]:
            full = v if os.path.isabs(v) else os.path.join(env.cwd, v)
            if os.path.isdir(full):
                found.append(full)
    return found


def _on_command(node: Node, env: _Env, depth: int) -> None:
    name_node = node.child_by_field_name("name")
    if name_node is None or name_node.named_child_count != 1:
        raise Refuse("a command without a literal name")
    word = word_arg(name_node.named_children[0]).text or ""
    name = word.rpartition("/")[2]
    args = node.children_by_field_name("argument")
    if name == "xargs":
        raise Refuse("xargs takes the files it reads from its "
                      "input, which cannot be checked; name the files directly")
    if name in _NON_READING:
        return
    lits = [word_arg(a) for a in args]
    texts = [a.text for a in lits]
    if name in _SHELLS:
        _judge_script(inner_shell_script(name, lits), env, depth + 1)
        return
    if name == "sed":
        check_sed(name, lits, reads=False)
    if name == "git" and "grep" in [t for t in texts if t and not t.startswith("-")][:1]:
        raise Refuse("git grep reads every tracked file, "
                      "credential files included; use grep_search")
    values: list[list[str]] = []
    for a in args:
        try:
            vals = _values(a, env)
        except _Unknown as exc:
            raise Refuse(f"cannot tell which file {node_source(a)!r} "
                          f"names ({exc} is only known when the command runs); give paths "
                          "literally") from None
        values.append(vals)
        for v in vals:
            for piece in _pieces(v):
                _judge_path(piece, node_source(a), env)
    words = [v for vs in values for v in vs]
    if name == "awk" and any(_AWK_READS.search(v) for v in words):
        raise Refuse("awk's getline and ARGV read files the command line does not name")
    if name == "jq" and any(_JQ_MODULES.search(v) or v.startswith("-L") or v == "--library-path"
                            for v in words):
        raise Refuse("jq modules read files the command line does not name")
    for directory in _recursive_dirs(name, args, values, env):
        _walk_check(directory, env, _follows(name, args))


def _on_redirect(node: Node, env: _Env) -> None:
    ops = [c.type for c in node.children if not c.is_named]
    if ops[:1] != ["<"]:
        return  # writes are the classifier's business (only /dev/null passes it)
    for dest in node.children_by_field_name("destination"):
        try:
            vals = _values(dest, env)
        except _Unknown as exc:
            raise Refuse(f"cannot tell which file "
                          f"{node_source(dest)!r} names ({exc})") from None
        for v in vals:
            _judge_path(v, node_source(dest), env)


def _judge_script(script: str, env: _Env, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise Refuse("too many nested shells")
    root, _ = parse_script(script)
    if root.has_error:
        raise Refuse("the command does not parse")
    stack = [root]
    while stack:
        n = stack.pop()
        if n.type == "command":
            _on_command(n, env, depth)
        elif n.type == "file_redirect":
            _on_redirect(n, env)
        stack.extend(n.children)


def shell_read_refusal(command: str, cwd: Path, scope: ReadScope, environ: Mapping[str, str]
                       ) -> str | None:
    """Why ``command`` (already proved read-only) would read what the agent may not — the
    sentence for the model — or None. ``environ`` is the environment the command runs with;
    never raises."""
    env = _Env(Path(os.path.abspath(cwd)), scope, environ)
    try:
        _judge_script(command, env, 0)
    except Refuse as exc:
        return f"run_shell_command refused: {exc}"
    except Exception as exc:  # noqa: BLE001 - fail closed
        return ("run_shell_command refused: cannot judge what the command reads "
                f"({type(exc).__name__})")
    return None
