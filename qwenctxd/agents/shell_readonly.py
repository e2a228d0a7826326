"""Decide whether a shell command is provably read-only, from its tree-sitter-bash AST.

Background agents may run ``run_shell_command`` only when :func:`classify` says the command is
read-only.  The check fails closed: a parse error, a node type it does not know, a command outside
the allow-list, an option that may write or execute, or a value it cannot see statically where
that value could become an option all make the verdict "not read-only".  Decisions and their
reasons are in docs/design.md, "Shell read-only classifier".

This module parses the script and walks its AST (turning words into arguments as the shell will
see them); the allow-list and the per-command argv rules are in
:mod:`qwenctxd.agents.shell_rules`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

from qwenctxd.agents.shell_rules import (
    BIN_DIRS,
    Arg,
    Nesting,
    Refuse,
    check_argv,
    check_test_args,
    check_var,
    inner_shell_script,
    literal_arg,
)

__all__ = ["MAX_COMMAND_CHARS", "Verdict", "classify", "strip_shell_wrapper"]

MAX_COMMAND_CHARS = 64 * 1024
_MAX_SHELL_DEPTH = 4  # nested `bash -c '…'` levels

_PARSER = Parser(Language(tree_sitter_bash.language()))
_PARSER_LOCK = threading.Lock()  # one Parser must not parse in two threads at once


@dataclass(frozen=True)
class Verdict:
    """The classifier's answer; ``reason`` names the first thing that is not read-only."""

    read_only: bool
    reason: str


def node_source(node: Node) -> str:
    return (node.text or b"").decode("utf-8", "replace")


def _descendants(node: Node) -> Iterator[Node]:
    stack = list(node.children)
    while stack:
        n = stack.pop()
        yield n
        stack.extend(n.children)


# --------------------------------------------------------------------------- arguments

_DQ_ESCAPE = re.compile(r'\\([$`"\\\n])')
_Piece = tuple[str | None, str, bool, bool]  # (literal, known prefix, IFS-splits, glob/brace)


def _piece(node: Node) -> _Piece:
    t, s = node.type, node_source(node)
    if t in ("word", "number"):
        if s.startswith("~"):
            return None, "~", False, False  # tilde expands to a path, never to an option
        out: list[str] = []
        i = 0
        while i < len(s):
            if s[i] == "\\" and i + 1 < len(s):
                out.append(s[i + 1])
                i += 2
                continue
            if s[i] in "*?[" or (s[i] == "{" and ("," in s[i:] or ".." in s[i:])):
                return None, "".join(out), False, True
            out.append(s[i])
            i += 1
        text = "".join(out)
        return text, text, False, False
    if t == "raw_string":
        return s[1:-1], s[1:-1], False, False
    if t == "string":
        kids = node.named_children
        if all(k.type == "string_content" for k in kids):
            text = _DQ_ESCAPE.sub(lambda m: "" if m[1] == "\n" else m[1], s[1:-1])
            return text, text, False, False
        first = kids[0]
        lead = node_source(first) if first.type == "string_content" and first.start_byte == node.start_byte + 1 else ""
        at = any(d.type == "special_variable_name" and node_source(d) == "@" for d in _descendants(node))
        return None, lead, at, False  # "$@" is several words
    if t == "ansi_c_string" and "\\" not in s:
        return s[2:-1], s[2:-1], False, False
    if t == "process_substitution":
        return None, "/dev/fd/", False, False
    if t == "concatenation":
        kids, srcs = node.children, [node_source(k) for k in node.children]
        parts = [
            (None, "", False, True) if src == "{" and any("," in x or ".." in x for x in srcs[k:])
            else _piece(kid) if kid.is_named else (None, "", True, True)
            for k, (kid, src) in enumerate(zip(kids, srcs, strict=True))
        ]
        if all(p[0] is not None for p in parts):
            text = "".join(p[0] or "" for p in parts)
            return text, text, False, False
        prefix = ""
        for lit, pre, _, _ in parts:
            prefix += pre
            if lit is None:
                break
        return None, prefix, any(p[2] for p in parts), any(p[3] for p in parts)
    return None, "", True, False  # unquoted expansion / substitution, or anything unknown


def word_arg(node: Node) -> Arg:
    lit, prefix, ifs, glob = _piece(node)
    if lit is not None:
        return Arg(lit, lit.startswith("-"), False, node_source(node), lit)
    may_dash = prefix == "" or prefix.startswith("-")
    return Arg(None, may_dash, ifs or (glob and may_dash), node_source(node), prefix, ifs or glob)


# --------------------------------------------------------------------------- AST walk

_PASS = frozenset(
    "program list pipeline subshell do_group if_statement elif_clause else_clause while_statement "
    "case_statement case_item negated_command redirected_statement string concatenation "
    "command_substitution heredoc_body heredoc_redirect herestring_redirect command_name comment "
    "word number raw_string ansi_c_string string_content heredoc_content heredoc_start heredoc_end "
    "variable_name special_variable_name simple_expansion file_descriptor extglob_pattern regex "
    "test_operator brace_expression array binary_expression unary_expression "
    "parenthesized_expression ternary_expression".split()
)
_EXPANSION_OPS = frozenset("${ } - :- + :+ ? :? # ## % %% / // /# /% ^ ^^ , ,,".split())
_ARITH_OK = frozenset("number binary_expression unary_expression parenthesized_expression "
                      "ternary_expression".split())
_ARITH_TESTS = frozenset("-eq -ne -lt -le -gt -ge".split())


def _on_command(node: Node, depth: int) -> None:
    name = node.child_by_field_name("name")
    if name is None or name.named_child_count != 1:
        raise Refuse("a command without a literal command name")
    word = word_arg(name.named_children[0]).text
    if word is None:
        raise Refuse(f"command name {node_source(name)!r} is not a literal word")
    check_argv(word, [word_arg(c) for c in node.children_by_field_name("argument")],
               Nesting(depth, _check_script))


def _on_redirect(node: Node, depth: int) -> None:
    ops = [c.type for c in node.children if not c.is_named]
    dests = node.children_by_field_name("destination")
    op = ops[0] if len(ops) == 1 else "?"
    dest = dests[0] if len(dests) == 1 else None
    if op == "<" and dest is not None:
        a = word_arg(dest)
        if any(a.prefix.startswith(n) or (a.text is None and n.startswith(a.prefix))
               for n in ("/dev/tcp/", "/dev/udp/")):
            raise Refuse(f"redirection {node_source(node)!r} may open a network connection")
        return
    if op in (">&-", "<&-"):
        return
    if op in (">&", "<&") and dest is not None and dest.type == "number":
        return  # descriptor duplication such as 2>&1
    if op in (">", ">>", ">|", "&>", "&>>", ">&") and dest is not None \
            and word_arg(dest).text == "/dev/null":
        return
    raise Refuse(f"redirection {node_source(node)!r} may write a file")


def _on_assignment(node: Node, depth: int) -> None:
    name = node.child_by_field_name("name")
    if node.parent is None or node.parent.type != "command":
        raise Refuse(f"bare assignment {node_source(node)!r} changes shell state")
    if name is None or name.type != "variable_name":
        raise Refuse(f"assignment {node_source(node)!r}")
    check_var(node_source(name))


def _on_for(node: Node, depth: int) -> None:
    var = node.child_by_field_name("variable")
    check_var(node_source(var) if var is not None else "")


def _on_process_substitution(node: Node, depth: int) -> None:
    if node.children[0].type != "<(":
        raise Refuse(f"output process substitution {node_source(node)!r} feeds a writer")


def _on_expansion(node: Node, depth: int) -> None:
    for c in node.children:
        if (not c.is_named and c.type not in _EXPANSION_OPS) or c.type == "subscript":
            raise Refuse(f"parameter expansion {node_source(node)!r} may assign or evaluate code")


def _on_arithmetic(node: Node, depth: int) -> None:
    if node.type == "compound_statement" and (not node.children or node.children[0].type != "(("):
        return
    if any(d.is_named and d.type not in _ARITH_OK for d in _descendants(node)):
        raise Refuse(f"arithmetic {node_source(node)!r} on variables can evaluate code in their values")


def _flatten_test(node: Node) -> list[Arg]:
    out: list[Arg] = []
    for c in node.children:
        if c.type in ("unary_expression", "binary_expression", "parenthesized_expression"):
            out.extend(_flatten_test(c))
        elif not c.is_named or c.type == "test_operator":
            out.append(literal_arg(node_source(c)))
        else:
            out.append(word_arg(c))
    return out


def _on_test(node: Node, depth: int) -> None:
    opener = node.children[0].type if node.children else ""
    if opener == "[":
        check_test_args("[", _flatten_test(node)[1:])
        return
    if opener != "[[":
        raise Refuse(f"unsupported test syntax {node_source(node)[:40]!r}")
    for d in _descendants(node):
        if d.type == "test_operator" and node_source(d) in ("-v", "-R"):
            raise Refuse("[[ -v/-R ]] evaluate array subscripts (code) in variable contents")
        op = d.child_by_field_name("operator") if d.type == "binary_expression" else None
        if op is not None and node_source(op) in _ARITH_TESTS and any(
                s is None or s.type != "number"
                for s in (d.child_by_field_name("left"), d.child_by_field_name("right"))):
            raise Refuse("[[ a -eq b ]] evaluates variable contents as arithmetic")


_HANDLERS: dict[str, Callable[[Node, int], None]] = {
    "command": _on_command, "file_redirect": _on_redirect, "variable_assignment": _on_assignment,
    "for_statement": _on_for, "process_substitution": _on_process_substitution,
    "expansion": _on_expansion, "arithmetic_expansion": _on_arithmetic,
    "compound_statement": _on_arithmetic, "test_command": _on_test,
}


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
# tree-sitter-bash 0.25 can SIGSEGV on "{" followed later by a 4-byte UTF-8 character
# (tree-sitter/tree-sitter-bash#337, open); no such character ever reaches the parser.
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")
_LITERAL = frozenset({"raw_string", "ansi_c_string", "comment", "heredoc_start", "heredoc_end"})
_LIVE = re.compile(r"\\.|(`|\$[({\[])", re.S)  # substitutions bash would run
_WORD_LIVE = re.compile(r"\\.|([`;|&<>()\s]|\$[({\[])", re.S)  # …and separators in a word


def _unparsed(node: Node) -> bool:
    """True when text tree-sitter left as plain text would be live syntax to bash (e.g. the
    backticks in ``${x:-`cmd`}`` or in a here-document body)."""
    if node.type in _LITERAL:
        return False
    data, base, own, pos = node.text or b"", node.start_byte, [], node.start_byte
    for c in node.children:
        own.append(data[pos - base:c.start_byte - base])
        pos = c.end_byte
    own.append(data[pos - base:])
    text = b"".join(own).decode("utf-8", "replace")
    pattern = _WORD_LIVE if node.type == "word" else _LIVE
    return any(m[1] for m in pattern.finditer(text))


def _quoted_heredoc(body: Node) -> bool:
    start = next((c for c in body.parent.children if c.type == "heredoc_start"), None) \
        if body.parent is not None else None
    return start is not None and any(q in node_source(start) for q in "'\"\\")


def _escaped(text: str | bytes, i: int) -> bool:
    """Whether text[i] is preceded by an odd number of backslashes."""
    bs, j = "\\" if isinstance(text, str) else b"\\", i
    while j > 0 and text[j - 1:j] == bs:
        j -= 1
    return (i - j) % 2 == 1


def _check_continuations(script: str) -> None:
    """Allow a backslash-newline only after an unescaped blank on a non-blank line: tree-sitter
    mis-joins other forms (``ls\\\n\\\ntouch p``, ``a=1\\\nls touch p``) that bash splits."""
    for m in re.finditer(r"\\\n", script):
        i = m.start()
        line = script[script.rfind("\n", 0, i) + 1:i]
        if not line.strip() or line[-1] not in " \t" or _escaped(script, i - 1):
            raise Refuse("a line continuation where the parser and bash may disagree")


def _comment_ok(node: Node, data: bytes) -> bool:
    """bash starts a comment only at the start of a word (``\\ #x`` is one word)."""
    i = node.start_byte
    return i == 0 or (data[i - 1:i] in (b"\n", b";", b"&", b"|", b"(", b")", b" ", b"\t")
                      and not _escaped(data, i - 1))


_ONE_LINE = frozenset({"command", "file_redirect", "herestring_redirect", "variable_assignment",
                       "concatenation", "test_command"})


def _spans_newline(node: Node, data: bytes) -> bool:
    """A newline between a simple command's parts: bash ends the command there, but tree-sitter
    may carry on (``ls ==\\ntouch p`` parses as one command)."""
    kids = node.children
    return any(b"\n" in data[a.end_byte:b.start_byte].replace(b"\\\n", b"")
               for a, b in zip(kids, kids[1:], strict=False))


def parse_script(script: str) -> tuple[Node, bytes]:
    if len(script) > MAX_COMMAND_CHARS:
        raise Refuse(f"command longer than {MAX_COMMAND_CHARS} characters")
    if _CONTROL.search(script):
        raise Refuse("command contains control characters (bash and the parser may split it differently)")
    if _ASTRAL.search(script):
        raise Refuse("characters beyond U+FFFF are refused (they can crash tree-sitter-bash)")
    _check_continuations(script)
    data = script.encode("utf-8")
    with _PARSER_LOCK:
        tree = _PARSER.parse(data)
    return tree.root_node, data


def _check_script(script: str, depth: int) -> None:
    if depth > _MAX_SHELL_DEPTH:
        raise Refuse("too many nested shells")
    root, data = parse_script(script)
    if root.has_error:
        raise Refuse("the command does not parse (syntax error or unsupported syntax)")
    stack = [root]
    while stack:
        node = stack.pop()
        if not node.is_named:
            continue  # tokens are checked by their parent's handler
        if node.type == "heredoc_body" and _quoted_heredoc(node):
            continue  # <<'EOF' bodies are literal text
        if _unparsed(node):
            raise Refuse(f"{node_source(node)[:40]!r}: text the parser did not understand")
        if node.type == "comment" and not _comment_ok(node, data):
            raise Refuse("a '#' that bash may not read as a comment")
        if node.type in _ONE_LINE and _spans_newline(node, data):
            raise Refuse(f"{node_source(node)[:40]!r} spans lines where bash ends the command")
        handler = _HANDLERS.get(node.type)
        if handler is not None:
            handler(node, depth)
        elif node.type not in _PASS:
            raise Refuse(f"unsupported shell syntax: {node.type} {node_source(node)[:40]!r}")
        stack.extend(reversed(node.children))


def classify(command: str) -> Verdict:
    """Return whether ``command`` is provably read-only; never raises."""
    try:
        if not command.strip():
            return Verdict(False, "empty command")
        _check_script(command, 0)
    except Refuse as e:
        reason = str(e)
        return Verdict(False, reason if len(reason) <= 240 else reason[:239] + "…")
    except Exception as e:  # noqa: BLE001 - fail closed on anything unexpected
        return Verdict(False, f"cannot analyse the command: {type(e).__name__}")
    return Verdict(True, "read-only: every command is allow-listed with read-only arguments")


def strip_shell_wrapper(command: str) -> str:
    """The inner script of ``bash -c '…'`` / ``sh -c "…"`` (literal script only), else ``command``."""
    try:
        root, _ = parse_script(command)
        if root.has_error or root.named_child_count != 1:
            return command
        node = root.named_children[0]
        name = node.child_by_field_name("name") if node.type == "command" else None
        if name is None or len(node.named_children) != 1 + len(node.children_by_field_name("argument")):
            return command
        word = word_arg(name.named_children[0]).text if name.named_child_count == 1 else None
        if word is None or word.rpartition("/")[2] not in ("bash", "sh", "dash") or (
                "/" in word and word.rpartition("/")[0] not in BIN_DIRS):
            return command
        return inner_shell_script(word, [word_arg(c) for c in node.children_by_field_name("argument")])
    except Exception:  # noqa: BLE001 - not a wrapper we can unwrap
        return command
