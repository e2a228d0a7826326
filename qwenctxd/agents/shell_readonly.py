"""Decide whether a shell command is provably read-only, from its tree-sitter-bash AST.

Background agents may run ``run_shell_command`` only when :func:`classify` says the command is
read-only.  The check fails closed: a parse error, a node type it does not know, a command outside
the allow-list, an option that may write or execute, or a value it cannot see statically where
that value could become an option all make the verdict "not read-only".  Decisions and their
reasons are in docs/design.md, "Shell read-only classifier".
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import tree_sitter_bash
from tree_sitter import Language, Node, Parser

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


class _Refuse(Exception):
    """Raised anywhere in the walk: the command is not provably read-only."""


@dataclass(frozen=True)
class _Arg:
    """One argument as the shell will see it, as far as the source tells."""

    text: str | None  # literal value; None when it depends on an expansion, glob or brace
    may_dash: bool  # its (first) word may start with "-"
    splits: bool  # may become several words, later ones unconstrained
    src: str
    prefix: str = ""  # the known start of its value
    multi: bool = False  # may become several words (IFS splitting, glob, brace expansion)

    @property
    def optionish(self) -> bool:
        return self.may_dash or self.splits


def _lit(text: str) -> _Arg:
    return _Arg(text, text.startswith("-"), False, text, text)


def _src(node: Node) -> str:
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
    t, s = node.type, _src(node)
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
        lead = _src(first) if first.type == "string_content" and first.start_byte == node.start_byte + 1 else ""
        at = any(d.type == "special_variable_name" and _src(d) == "@" for d in _descendants(node))
        return None, lead, at, False  # "$@" is several words
    if t == "ansi_c_string" and "\\" not in s:
        return s[2:-1], s[2:-1], False, False
    if t == "process_substitution":
        return None, "/dev/fd/", False, False
    if t == "concatenation":
        kids, srcs = node.children, [_src(k) for k in node.children]
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


def _arg(node: Node) -> _Arg:
    lit, prefix, ifs, glob = _piece(node)
    if lit is not None:
        return _Arg(lit, lit.startswith("-"), False, _src(node), lit)
    may_dash = prefix == "" or prefix.startswith("-")
    return _Arg(None, may_dash, ifs or (glob and may_dash), _src(node), prefix, ifs or glob)


def _options(
    cmd: str, args: list[_Arg], *, takes: str = "", attached: str = "", bad: str = "",
    bad_long: tuple[str, ...] = (), long_takes: tuple[str, ...] = (), permute: bool = True,
) -> tuple[list[tuple[str, _Arg | None]], list[_Arg]]:
    """getopt-like scan: refuse bad options (long ones also when abbreviated) and values that
    could smuggle in an option; return the options seen and the operands."""
    opts: list[tuple[str, _Arg | None]] = []
    pos: list[_Arg] = []
    i, ended = 0, False

    def value() -> _Arg | None:
        nonlocal i
        if i >= len(args):
            return None
        v = args[i]
        i += 1
        if v.multi:
            raise _Refuse(f"{cmd}: option value {v.src!r} may expand to several words")
        return v

    while i < len(args):
        a = args[i]
        i += 1
        t = a.text
        if ended or t is None or not t.startswith("-") or t == "-":
            if not ended and a.optionish:
                raise _Refuse(f"{cmd}: argument {a.src!r} may expand to an option")
            pos.append(a)
            ended = ended or not permute
        elif t == "--":
            ended = True
        elif t.startswith("--"):
            name, eq, val = t[2:].partition("=")
            if any(b.startswith(name) for b in bad_long):
                raise _Refuse(f"{cmd}: option --{name} may write files or run programs")
            opts.append((name, _lit(val) if eq else value() if name in long_takes else None))
        else:
            for j, ch in enumerate(t[1:], 1):
                if ch in bad:
                    raise _Refuse(f"{cmd}: option -{ch} may write files or run programs")
                if ch in takes or ch in attached:
                    rest = t[j + 1:]
                    opts.append((ch, _lit(rest) if rest or ch in attached else value()))
                    break
                opts.append((ch, None))
    return opts, pos


# --------------------------------------------------------------------------- command rules

_BIN_DIRS = frozenset({"/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin"})
_SIMPLE = frozenset(
    "ls cat head tail wc grep egrep fgrep stat du df pwd echo true false : which type basename "
    "dirname realpath readlink cut tr nl diff cmp comm jq uname whoami id ps uptime free nproc "
    "printenv seq md5sum sha1sum sha224sum sha256sum sha384sum sha512sum b2sum cksum od hexdump".split()
)
_REFUSED = {
    **dict.fromkeys(["eval", "source", ".", "exec", "builtin"], "runs code the classifier cannot see"),
    **dict.fromkeys(["alias", "trap", "set", "shopt", "export", "read", "mapfile", "readarray",
                     "let", "getopts", "enable", "hash", "umask", "ulimit"], "changes shell state"),
    **dict.fromkeys(["cd", "pushd", "popd"], "changes the working directory (not allowed)"),
    **dict.fromkeys(["sudo", "doas", "su", "pkexec"], "runs with other privileges"),
    **dict.fromkeys(["less", "more", "most", "vi", "vim", "nano"], "interactive; use cat/head"),
    "nohup": "may create nohup.out",
}
_BAD_VARS = frozenset(
    "PATH IFS ENV BASH_ENV PS4 PROMPT_COMMAND SHELLOPTS BASHOPTS HOME CDPATH GLOBIGNORE EXECIGNORE "
    "BASH_XTRACEFD BASH_LOADABLES_PATH BASH_COMPAT FUNCNEST GCONV_PATH LOCPATH NLSPATH HOSTALIASES "
    "XDG_CONFIG_HOME XDG_CONFIG_DIRS PAGER MANPAGER EDITOR VISUAL SHELL TERMINFO TMPDIR "
    "RIPGREP_CONFIG_PATH AWKPATH AWKLIBPATH GREP_OPTIONS POSIXLY_CORRECT".split()
)
_BAD_VAR_PREFIXES = ("LD_", "DYLD_", "GIT_", "BASH_FUNC_", "LESS", "SSH_")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


_Rule = Callable[[str, list["_Arg"], int], None]


def _check_var(name: str) -> None:
    if not _NAME.match(name):
        raise _Refuse(f"assignment to {name!r}")
    if name in _BAD_VARS or name.startswith(_BAD_VAR_PREFIXES):
        raise _Refuse(f"assignment to {name} may change what runs or where it writes")


def _check_argv(name: str, args: list[_Arg], depth: int) -> None:
    if "/" in name:
        head, _, base = name.rpartition("/")
        if head not in _BIN_DIRS:
            raise _Refuse(f"{name}: only allow-listed commands from a standard bin directory")
        name = base
    if name in _REFUSED:
        raise _Refuse(f"{name}: {_REFUSED[name]}")
    if name in _SIMPLE:
        return
    rule = _RULES.get(name)
    if rule is None:
        raise _Refuse(f"{name}: not an allow-listed read-only command")
    rule(name, args, depth)


def _run_inner(cmd: str, rest: list[_Arg], depth: int, *, required: bool = True) -> None:
    if not rest:
        if required:
            raise _Refuse(f"{cmd}: no command to run")
        return
    if rest[0].text is None:
        raise _Refuse(f"{cmd}: the command it runs ({rest[0].src!r}) is not a literal word")
    _check_argv(rest[0].text, rest[1:], depth)


_SED_LETTERS = set("pdDgGhHlnNPqQxzF=v")


def _sed_delim(s: str, k: int) -> int:
    """Index of the next unescaped s[k] after k, or -1."""
    d, j = s[k], k + 1
    if d in "\\\n":
        return -1
    while j < len(s):
        if s[j] == "\\":
            j += 2
        elif s[j] == d:
            return j
        else:
            j += 1
    return -1


def _sed_script_ok(s: str) -> bool:
    """True when a sed script has no w/W/e commands and no s///w or s///e flags."""
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c in " \t\n;{}!,$~+" or c.isdigit() or c in _SED_LETTERS:
            i += 1
        elif c in "/\\":  # regex address /re/ or \cREc
            k = i + 1 if c == "\\" else i
            if k >= n or (j := _sed_delim(s, k)) < 0:
                return False
            i = j + 1
            while i < n and s[i] in "IM":
                i += 1
        elif c in "sy":
            j1 = _sed_delim(s, i + 1) if i + 1 < n else -1
            j2 = _sed_delim(s, j1) if j1 > 0 else -1
            if j2 < 0:
                return False
            i = j2 + 1
            while c == "s" and i < n and s[i] in "gpiImM0123456789":
                i += 1
            if i < n and s[i] not in " \t\n;}#":
                return False  # a w or e flag, or junk
        elif c in "btT:":
            i += 1
            while i < n and s[i] in " \t":
                i += 1
            while i < n and s[i] not in " \t\n;}":
                i += 1
        elif c in "aicrR#":  # text / read-file / comment: runs to the end of the line
            while i < n and s[i] != "\n":
                i += 2 if s[i] == "\\" else 1
        else:
            return False  # w, W, e, or something unknown
    return True


def _sed(cmd: str, args: list[_Arg], depth: int) -> None:
    opts, pos = _options(cmd, args, takes="el", bad="iIf", bad_long=("in-place", "file"),
                         long_takes=("expression", "line-length"))
    scripts = [v for k, v in opts if k == "e" or (len(k) > 1 and "expression".startswith(k))]
    if not scripts and pos:
        scripts = [pos[0]]
    for s in scripts:
        if s is None or s.text is None or not _sed_script_ok(s.text):
            raise _Refuse(f"sed: script {s.src if s else ''!r} may write files or run commands")


_FIND_ARG = frozenset(
    "-name -iname -path -ipath -wholename -iwholename -regex -iregex -lname -ilname -type -xtype "
    "-user -group -uid -gid -perm -size -mtime -mmin -atime -amin -ctime -cmin -newer -anewer "
    "-cnewer -maxdepth -mindepth -samefile -links -inum -used -fstype -printf -regextype -context "
    "-files0-from -D".split()
)


def _find(cmd: str, args: list[_Arg], depth: int) -> None:
    expect_value = False
    for a in args:
        t = a.text
        if expect_value:
            expect_value = False
            if a.multi:
                raise _Refuse(f"find: value {a.src!r} may expand to several words")
        elif t is None:
            if a.optionish:
                raise _Refuse(f"find: {a.src!r} may expand to an expression such as -delete")
        elif t in ("-delete", "-fls") or t.startswith(("-exec", "-ok", "-fprint")):
            raise _Refuse(f"find: {t} writes files or runs commands")
        else:
            expect_value = t in _FIND_ARG or t.startswith("-newer")


def _opts_rule(max_operands: int | None = None, **kw: Any) -> _Rule:
    """A rule that only scans options (and, for uniq, counts operands: a second one is written)."""

    def rule(cmd: str, args: list[_Arg], depth: int) -> None:
        _, pos = _options(cmd, args, **kw)
        if max_operands is not None and (len(pos) > max_operands or any(p.multi for p in pos)):
            raise _Refuse(f"{cmd}: a further file operand is an output file")

    return rule


def _date(cmd: str, args: list[_Arg], depth: int) -> None:
    _, pos = _options(cmd, args, takes="dfr", attached="I", bad="s", bad_long=("set",),
                      long_takes=("date", "file", "reference"))
    if any(p.text is None or not p.text.startswith("+") for p in pos):
        raise _Refuse("date: an operand that is not +FORMAT sets the clock")


_HOSTNAME_OK = frozenset("-f -s -i -I -d -a -A --fqdn --long --short --ip-address "
                         "--all-ip-addresses --domain --alias --all-fqdns".split())


def _hostname(cmd: str, args: list[_Arg], depth: int) -> None:
    if any(a.text not in _HOSTNAME_OK for a in args):
        raise _Refuse("hostname: only query options are allowed (an operand sets the name)")


def _xxd(cmd: str, args: list[_Arg], depth: int) -> None:
    pos, i = 0, 0
    while i < len(args):
        t = args[i].text
        i += 1
        if t is None or t.startswith("-r"):
            raise _Refuse("xxd: -r or a non-literal argument (xxd -r writes binary)")
        if t in ("-c", "-cols", "-g", "-groupsize", "-l", "-len", "-n", "-name", "-o", "-s",
                 "-seek", "-R"):
            i += 1
        elif t == "-" or not t.startswith("-"):
            pos += 1
    if pos > 1:
        raise _Refuse("xxd: a second operand is an output file")


def _awk(cmd: str, args: list[_Arg], depth: int) -> None:
    opts, pos = _options(cmd, args, takes="Fv", long_takes=("field-separator", "assign"),
                         permute=False)
    if any(k not in ("F", "v", "field-separator", "assign") for k, _ in opts):
        raise _Refuse("awk: only -F and -v are allowed (others load files or write profiles)")
    prog = pos[0].text if pos else None
    if prog is None or any(x in prog for x in ("system", ">", "|", "@", "/inet")):
        raise _Refuse("awk: program may write files or run commands (system, >, |)")


_GIT_GLOBAL_OK = frozenset("--no-pager -P --no-optional-locks --literal-pathspecs --glob-pathspecs "
                           "--noglob-pathspecs --icase-pathspecs --no-replace-objects".split())
_GIT_READ = frozenset("status log show diff blame rev-parse ls-files ls-tree cat-file describe "
                      "shortlog grep rev-list merge-base show-ref for-each-ref count-objects "
                      "name-rev branch tag remote config".split())
_GIT_BAD_LONG = ("output", "output-directory", "ext-diff", "open-files-in-pager", "paginate")
_GIT_CONFIG_READ = {"get", "get-all", "get-regexp", "get-urlmatch", "list", "l"}
_GIT_CONFIG_WRITE = {"add", "replace-all", "unset", "unset-all", "rename-section",
                     "remove-section", "e", "edit", "set"}


def _git(cmd: str, args: list[_Arg], depth: int) -> None:
    i = 0
    while i < len(args) and args[i].text in _GIT_GLOBAL_OK:
        i += 1
    sub = args[i].text if i < len(args) else None
    if sub is None or sub.startswith("-"):
        raise _Refuse(f"git: {args[i].src if i < len(args) else 'no subcommand'}: global options "
                      "such as -c, -C and --git-dir can change what git runs")
    if sub not in _GIT_READ:
        raise _Refuse(f"git {sub}: not a read-only git subcommand")
    opts, pos = _options(f"git {sub}", args[i + 1:], bad="O" if sub == "grep" else "",
                         bad_long=_GIT_BAD_LONG)
    keys = {k for k, _ in opts}
    words = [p.text for p in pos]
    if sub == "branch" and (not keys <= {"a", "r", "l", "v", "all", "remotes", "list", "verbose",
                                         "show-current", "no-color"}
                            or (pos and not keys & {"l", "list"})):
        raise _Refuse("git branch: only listing (-a, -r, -v, --list) is read-only")
    if sub == "tag" and (not keys <= {"l", "list"} or (pos and not keys)):
        raise _Refuse("git tag: only listing (no arguments or -l) is read-only")
    if sub == "remote" and not ((not pos and keys <= {"v", "verbose"})
                                or (words[:1] == ["get-url"] and len(pos) == 2)):
        raise _Refuse("git remote: only listing (-v) and get-url are read-only")
    if sub == "config" and (keys & _GIT_CONFIG_WRITE or (words[:1] and words[0] in _GIT_CONFIG_WRITE)
                            or not (keys & _GIT_CONFIG_READ or words[:1] in (["get"], ["list"]))):
        raise _Refuse("git config: only --get/--get-all/--get-regexp/--list are read-only")


def _env(cmd: str, args: list[_Arg], depth: int) -> None:
    i = 0
    while i < len(args):
        t = args[i].text
        if t is None:
            raise _Refuse(f"env: {args[i].src!r} is not a literal word")
        if t in ("-u", "--unset"):
            i += 1
            if i < len(args) and args[i].text is None:
                raise _Refuse("env: -u needs a literal name")
        elif t.startswith("-") and t not in ("-i", "--ignore-environment", "-0", "--null", "--") \
                and not t.startswith(("-u", "--unset=")):
            raise _Refuse(f"env: option {t} is not allowed")
        elif "=" in t and not t.startswith("-"):
            _check_var(t.partition("=")[0])
        elif not t.startswith("-"):
            break
        i += 1
    _run_inner(cmd, args[i:], depth, required=False)


def _xargs(cmd: str, args: list[_Arg], depth: int) -> None:
    _, pos = _options(cmd, args, takes="adEILnPs", attached="eil", bad="po",
                      bad_long=("open-tty", "interactive"), permute=False)
    if pos and pos[0].text not in _SIMPLE:
        raise _Refuse(f"xargs: {pos[0].src} is not a command that is read-only for any argument")
    _run_inner(cmd, pos, depth, required=False)


def _wrapper(takes: str = "", skip: int = 0, long_takes: tuple[str, ...] = ()) -> _Rule:
    def rule(cmd: str, args: list[_Arg], depth: int) -> None:
        opts, pos = _options(cmd, args, takes=takes, long_takes=long_takes, permute=False)
        if cmd == "command" and any(k in ("v", "V") for k, _ in opts):
            return  # command -v NAME only prints
        if any(p.multi for p in pos[:skip]):
            raise _Refuse(f"{cmd}: {pos[0].src!r} may expand to several words")
        _run_inner(cmd, pos[skip:], depth, required=cmd == "timeout")

    return rule


def _test(cmd: str, args: list[_Arg], depth: int) -> None:
    if cmd == "[" and args and args[-1].text == "]":
        args = args[:-1]
    if any(a.text in ("-v", "-R") for a in args):
        raise _Refuse(f"{cmd}: -v/-R evaluate array subscripts (code) in variable contents")
    if all(a.text is not None for a in args):
        return
    n = len(args)
    if any(a.multi for a in args) or n > 3 or (n >= 2 and args[n - 2].text is None):
        raise _Refuse(f"{cmd}: a non-literal argument could become a test operator")


def _shell_script(cmd: str, args: list[_Arg]) -> str:
    i, seen_c = 0, False
    while i < len(args):
        t = args[i].text or ""
        if t in ("--norc", "--noprofile"):
            i += 1
        elif t == "-o" and i + 1 < len(args) and args[i + 1].text == "pipefail":
            i += 2
        elif len(t) > 1 and t[0] == "-" and set(t[1:]) <= set("ceu"):
            seen_c, i = seen_c or "c" in t, i + 1
        else:
            break
    if not seen_c or i >= len(args) or args[i].text is None:
        raise _Refuse(f"{cmd}: only `{cmd} -c '<literal script>'` is allowed, not a script file")
    return args[i].text  # type: ignore[return-value]


def _shell(cmd: str, args: list[_Arg], depth: int) -> None:
    _check_script(_shell_script(cmd, args), depth + 1)


_RULES: dict[str, _Rule] = {
    "sed": _sed, "find": _find, "date": _date, "hostname": _hostname, "xxd": _xxd, "awk": _awk,
    "git": _git, "env": _env, "xargs": _xargs, "test": _test, "[": _test,
    "bash": _shell, "sh": _shell, "dash": _shell,
    "sort": _opts_rule(takes="kotST", bad="oT", long_takes=("key", "field-separator"),
                         bad_long=("output", "compress-program", "temporary-directory")),
    "uniq": _opts_rule(1, takes="fsw", long_takes=("skip-fields", "skip-chars",
                                                          "check-chars")),
    "fd": _opts_rule(takes="dEetSjco", bad="xX", bad_long=("exec", "exec-batch")),
    "tree": _opts_rule(takes="LPIHT", bad="oR", bad_long=("output",)),
    "file": _opts_rule(takes="mfFeP", bad="C", bad_long=("compile",)),
    "yq": _opts_rule(takes="opI", bad="is", bad_long=("inplace", "in-place", "split-exp")),
    "rg": _opts_rule(takes="ABCefgjmMrtTEd", bad_long=("pre", "hostname-bin")),
    "ag": _opts_rule(takes="ABCGgmp", bad_long=("pager",)),
    "printf": _opts_rule(bad="v", permute=False),
    "time": _wrapper(), "nice": _wrapper(takes="n", long_takes=("adjustment",)),
    "command": _wrapper(), "timeout": _wrapper(takes="sk", skip=1,
                                               long_takes=("signal", "kill-after")),
}


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
        raise _Refuse("a command without a literal command name")
    word = _arg(name.named_children[0]).text
    if word is None:
        raise _Refuse(f"command name {_src(name)!r} is not a literal word")
    _check_argv(word, [_arg(c) for c in node.children_by_field_name("argument")], depth)


def _on_redirect(node: Node, depth: int) -> None:
    ops = [c.type for c in node.children if not c.is_named]
    dests = node.children_by_field_name("destination")
    op = ops[0] if len(ops) == 1 else "?"
    dest = dests[0] if len(dests) == 1 else None
    if op == "<" and dest is not None:
        a = _arg(dest)
        if any(a.prefix.startswith(n) or (a.text is None and n.startswith(a.prefix))
               for n in ("/dev/tcp/", "/dev/udp/")):
            raise _Refuse(f"redirection {_src(node)!r} may open a network connection")
        return
    if op in (">&-", "<&-"):
        return
    if op in (">&", "<&") and dest is not None and dest.type == "number":
        return  # descriptor duplication such as 2>&1
    if op in (">", ">>", ">|", "&>", "&>>", ">&") and dest is not None \
            and _arg(dest).text == "/dev/null":
        return
    raise _Refuse(f"redirection {_src(node)!r} may write a file")


def _on_assignment(node: Node, depth: int) -> None:
    name = node.child_by_field_name("name")
    if node.parent is None or node.parent.type != "command":
        raise _Refuse(f"bare assignment {_src(node)!r} changes shell state")
    if name is None or name.type != "variable_name":
        raise _Refuse(f"assignment {_src(node)!r}")
    _check_var(_src(name))


def _on_for(node: Node, depth: int) -> None:
    var = node.child_by_field_name("variable")
    _check_var(_src(var) if var is not None else "")


def _on_process_substitution(node: Node, depth: int) -> None:
    if node.children[0].type != "<(":
        raise _Refuse(f"output process substitution {_src(node)!r} feeds a writer")


def _on_expansion(node: Node, depth: int) -> None:
    for c in node.children:
        if (not c.is_named and c.type not in _EXPANSION_OPS) or c.type == "subscript":
            raise _Refuse(f"parameter expansion {_src(node)!r} may assign or evaluate code")


def _on_arithmetic(node: Node, depth: int) -> None:
    if node.type == "compound_statement" and (not node.children or node.children[0].type != "(("):
        return
    if any(d.is_named and d.type not in _ARITH_OK for d in _descendants(node)):
        raise _Refuse(f"arithmetic {_src(node)!r} on variables can evaluate code in their values")


def _flatten_test(node: Node) -> list[_Arg]:
    out: list[_Arg] = []
    for c in node.children:
        if c.type in ("unary_expression", "binary_expression", "parenthesized_expression"):
            out.extend(_flatten_test(c))
        elif not c.is_named or c.type == "test_operator":
            out.append(_lit(_src(c)))
        else:
            out.append(_arg(c))
    return out


def _on_test(node: Node, depth: int) -> None:
    opener = node.children[0].type if node.children else ""
    if opener == "[":
        _test("[", _flatten_test(node)[1:], depth)
        return
    if opener != "[[":
        raise _Refuse(f"unsupported test syntax {_src(node)[:40]!r}")
    for d in _descendants(node):
        if d.type == "test_operator" and _src(d) in ("-v", "-R"):
            raise _Refuse("[[ -v/-R ]] evaluate array subscripts (code) in variable contents")
        op = d.child_by_field_name("operator") if d.type == "binary_expression" else None
        if op is not None and _src(op) in _ARITH_TESTS and any(
                s is None or s.type != "number"
                for s in (d.child_by_field_name("left"), d.child_by_field_name("right"))):
            raise _Refuse("[[ a -eq b ]] evaluates variable contents as arithmetic")


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
    return start is not None and any(q in _src(start) for q in "'\"\\")


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
            raise _Refuse("a line continuation where the parser and bash may disagree")


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


def _parse(script: str) -> tuple[Node, bytes]:
    if len(script) > MAX_COMMAND_CHARS:
        raise _Refuse(f"command longer than {MAX_COMMAND_CHARS} characters")
    if _CONTROL.search(script):
        raise _Refuse("command contains control characters (bash and the parser may split it differently)")
    if _ASTRAL.search(script):
        raise _Refuse("characters beyond U+FFFF are refused (they can crash tree-sitter-bash)")
    _check_continuations(script)
    data = script.encode("utf-8")
    with _PARSER_LOCK:
        tree = _PARSER.parse(data)
    return tree.root_node, data


def _check_script(script: str, depth: int) -> None:
    if depth > _MAX_SHELL_DEPTH:
        raise _Refuse("too many nested shells")
    root, data = _parse(script)
    if root.has_error:
        raise _Refuse("the command does not parse (syntax error or unsupported syntax)")
    stack = [root]
    while stack:
        node = stack.pop()
        if not node.is_named:
            continue  # tokens are checked by their parent's handler
        if node.type == "heredoc_body" and _quoted_heredoc(node):
            continue  # <<'EOF' bodies are literal text
        if _unparsed(node):
            raise _Refuse(f"{_src(node)[:40]!r}: text the parser did not understand")
        if node.type == "comment" and not _comment_ok(node, data):
            raise _Refuse("a '#' that bash may not read as a comment")
        if node.type in _ONE_LINE and _spans_newline(node, data):
            raise _Refuse(f"{_src(node)[:40]!r} spans lines where bash ends the command")
        handler = _HANDLERS.get(node.type)
        if handler is not None:
            handler(node, depth)
        elif node.type not in _PASS:
            raise _Refuse(f"unsupported shell syntax: {node.type} {_src(node)[:40]!r}")
        stack.extend(reversed(node.children))


def classify(command: str) -> Verdict:
    """Return whether ``command`` is provably read-only; never raises."""
    try:
        if not command.strip():
            return Verdict(False, "empty command")
        _check_script(command, 0)
    except _Refuse as e:
        reason = str(e)
        return Verdict(False, reason if len(reason) <= 240 else reason[:239] + "…")
    except Exception as e:  # noqa: BLE001 - fail closed on anything unexpected
        return Verdict(False, f"cannot analyse the command: {type(e).__name__}")
    return Verdict(True, "read-only: every command is allow-listed with read-only arguments")


def strip_shell_wrapper(command: str) -> str:
    """The inner script of ``bash -c '…'`` / ``sh -c "…"`` (literal script only), else ``command``."""
    try:
        root, _ = _parse(command)
        if root.has_error or root.named_child_count != 1:
            return command
        node = root.named_children[0]
        name = node.child_by_field_name("name") if node.type == "command" else None
        if name is None or len(node.named_children) != 1 + len(node.children_by_field_name("argument")):
            return command
        word = _arg(name.named_children[0]).text if name.named_child_count == 1 else None
        if word is None or word.rpartition("/")[2] not in ("bash", "sh", "dash") or (
                "/" in word and word.rpartition("/")[0] not in _BIN_DIRS):
            return command
        return _shell_script(word, [_arg(c) for c in node.children_by_field_name("argument")])
    except Exception:  # noqa: BLE001 - not a wrapper we can unwrap
        return command
