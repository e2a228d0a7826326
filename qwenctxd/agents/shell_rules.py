"""The allow-list behind :mod:`qwenctxd.agents.shell_readonly`: which commands may run, which
variables may not be assigned, and the per-command argv rules (sed scripts, find expressions,
git subcommands, wrappers such as env/xargs/timeout, ``bash -c``…).

A rule gets the command name, its arguments as :class:`Arg` (what the shell will see, as far
as the source tells) and a :class:`Nesting` (the ``bash -c`` depth and the parser's own script
check, passed in so this module never imports the parser), and raises :class:`Refuse` when the
command may write files or run something the classifier cannot see.  Parsing the script into
those arguments, and walking the AST, stay in :mod:`qwenctxd.agents.shell_readonly`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class Refuse(Exception):
    """Raised anywhere in the walk: the command is not provably read-only."""


@dataclass(frozen=True)
class Arg:
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


def literal_arg(text: str) -> Arg:
    return Arg(text, text.startswith("-"), False, text, text)


# --------------------------------------------------------------------------- options

def scan_options(
    cmd: str, args: list[Arg], *, takes: str = "", attached: str = "", bad: str = "",
    bad_long: tuple[str, ...] = (), long_takes: tuple[str, ...] = (), permute: bool = True,
) -> tuple[list[tuple[str, Arg | None]], list[Arg]]:
    """getopt-like scan: refuse bad options (long ones also when abbreviated) and values that
    could smuggle in an option; return the options seen and the operands."""
    opts: list[tuple[str, Arg | None]] = []
    pos: list[Arg] = []
    i, ended = 0, False

    def value() -> Arg | None:
        nonlocal i
        if i >= len(args):
            return None
        v = args[i]
        i += 1
        if v.multi:
            raise Refuse(f"{cmd}: option value {v.src!r} may expand to several words")
        return v

    while i < len(args):
        a = args[i]
        i += 1
        t = a.text
        if ended or t is None or not t.startswith("-") or t == "-":
            if not ended and a.optionish:
                raise Refuse(f"{cmd}: argument {a.src!r} may expand to an option")
            pos.append(a)
            ended = ended or not permute
        elif t == "--":
            ended = True
        elif t.startswith("--"):
            name, eq, val = t[2:].partition("=")
            if any(b.startswith(name) for b in bad_long):
                raise Refuse(f"{cmd}: option --{name} may write files or run programs")
            opts.append((name, literal_arg(val) if eq else value() if name in long_takes else None))
        else:
            for j, ch in enumerate(t[1:], 1):
                if ch in bad:
                    raise Refuse(f"{cmd}: option -{ch} may write files or run programs")
                if ch in takes or ch in attached:
                    rest = t[j + 1:]
                    opts.append((ch, literal_arg(rest) if rest or ch in attached else value()))
                    break
                opts.append((ch, None))
    return opts, pos


# --------------------------------------------------------------------------- command rules

BIN_DIRS = frozenset({"/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin"})
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


ScriptCheck = Callable[[str, int], None]
"""Checks a whole script at a ``bash -c`` nesting depth (the parser's walk, passed down)."""


@dataclass(frozen=True)
class Nesting:
    """Where a command sits: its ``bash -c`` depth, and the checker for an inner script.

    The parser's walk (:mod:`qwenctxd.agents.shell_readonly`) passes its own script check in, so
    ``bash -c '…'`` is checked like the outer script while this module imports nothing of it."""

    depth: int
    check_script: ScriptCheck


_Rule = Callable[[str, list["Arg"], Nesting], None]


def check_var(name: str) -> None:
    if not _NAME.match(name):
        raise Refuse(f"assignment to {name!r}")
    if name in _BAD_VARS or name.startswith(_BAD_VAR_PREFIXES):
        raise Refuse(f"assignment to {name} may change what runs or where it writes")


def check_argv(name: str, args: list[Arg], nest: Nesting) -> None:
    if "/" in name:
        head, _, base = name.rpartition("/")
        if head not in BIN_DIRS:
            raise Refuse(f"{name}: only allow-listed commands from a standard bin directory")
        name = base
    if name in _REFUSED:
        raise Refuse(f"{name}: {_REFUSED[name]}")
    if name in _SIMPLE:
        return
    rule = _RULES.get(name)
    if rule is None:
        raise Refuse(f"{name}: not an allow-listed read-only command")
    rule(name, args, nest)


def _run_inner(cmd: str, rest: list[Arg], nest: Nesting, *, required: bool = True) -> None:
    if not rest:
        if required:
            raise Refuse(f"{cmd}: no command to run")
        return
    if rest[0].text is None:
        raise Refuse(f"{cmd}: the command it runs ({rest[0].src!r}) is not a literal word")
    check_argv(rest[0].text, rest[1:], nest)


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


def _sed_script_ok(s: str, reads: bool = True) -> bool:
    """True when a sed script has no w/W/e commands and no s///w or s///e flags (nor, with
    ``reads=False``, the r/R commands that read a file the command line does not name)."""
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
        elif c in "rR" and not reads:
            return False
        elif c in "aicrR#":  # text / read-file / comment: runs to the end of the line
            while i < n and s[i] != "\n":
                i += 2 if s[i] == "\\" else 1
        else:
            return False  # w, W, e, or something unknown
    return True


def check_sed(cmd: str, args: list[Arg], *, reads: bool = True) -> None:
    opts, pos = scan_options(cmd, args, takes="el", bad="iIf", bad_long=("in-place", "file"),
                         long_takes=("expression", "line-length"))
    scripts = [v for k, v in opts if k == "e" or (len(k) > 1 and "expression".startswith(k))]
    if not scripts and pos:
        scripts = [pos[0]]
    for s in scripts:
        if s is None or s.text is None or not _sed_script_ok(s.text, reads):
            raise Refuse(f"sed: script {s.src if s else ''!r} may write files, run commands"
                          f"{'' if reads else ' or read files it does not name'}")


_FIND_ARG = frozenset(
    "-name -iname -path -ipath -wholename -iwholename -regex -iregex -lname -ilname -type -xtype "
    "-user -group -uid -gid -perm -size -mtime -mmin -atime -amin -ctime -cmin -newer -anewer "
    "-cnewer -maxdepth -mindepth -samefile -links -inum -used -fstype -printf -regextype -context "
    "-files0-from -D".split()
)


def _find(cmd: str, args: list[Arg], nest: Nesting) -> None:
    expect_value = False
    for a in args:
        t = a.text
        if expect_value:
            expect_value = False
            if a.multi:
                raise Refuse(f"find: value {a.src!r} may expand to several words")
        elif t is None:
            if a.optionish:
                raise Refuse(f"find: {a.src!r} may expand to an expression such as -delete")
        elif t in ("-delete", "-fls") or t.startswith(("-exec", "-ok", "-fprint")):
            raise Refuse(f"find: {t} writes files or runs commands")
        else:
            expect_value = t in _FIND_ARG or t.startswith("-newer")


def _opts_rule(max_operands: int | None = None, **kw: Any) -> _Rule:
    """A rule that only scans options (and, for uniq, counts operands: a second one is written)."""

    def rule(cmd: str, args: list[Arg], nest: Nesting) -> None:
        _, pos = scan_options(cmd, args, **kw)
        if max_operands is not None and (len(pos) > max_operands or any(p.multi for p in pos)):
            raise Refuse(f"{cmd}: a further file operand is an output file")

    return rule


def _date(cmd: str, args: list[Arg], nest: Nesting) -> None:
    _, pos = scan_options(cmd, args, takes="dfr", attached="I", bad="s", bad_long=("set",),
                      long_takes=("date", "file", "reference"))
    if any(p.text is None or not p.text.startswith("+") for p in pos):
        raise Refuse("date: an operand that is not +FORMAT sets the clock")


_HOSTNAME_OK = frozenset("-f -s -i -I -d -a -A --fqdn --long --short --ip-address "
                         "--all-ip-addresses --domain --alias --all-fqdns".split())


def _hostname(cmd: str, args: list[Arg], nest: Nesting) -> None:
    if any(a.text not in _HOSTNAME_OK for a in args):
        raise Refuse("hostname: only query options are allowed (an operand sets the name)")


def _xxd(cmd: str, args: list[Arg], nest: Nesting) -> None:
    pos, i = 0, 0
    while i < len(args):
        t = args[i].text
        i += 1
        if t is None or t.startswith("-r"):
            raise Refuse("xxd: -r or a non-literal argument (xxd -r writes binary)")
        if t in ("-c", "-cols", "-g", "-groupsize", "-l", "-len", "-n", "-name", "-o", "-s",
                 "-seek", "-R"):
            i += 1
        elif t == "-" or not t.startswith("-"):
            pos += 1
    if pos > 1:
        raise Refuse("xxd: a second operand is an output file")


def _awk(cmd: str, args: list[Arg], nest: Nesting) -> None:
    opts, pos = scan_options(cmd, args, takes="Fv", long_takes=("field-separator", "assign"),
                         permute=False)
    if any(k not in ("F", "v", "field-separator", "assign") for k, _ in opts):
        raise Refuse("awk: only -F and -v are allowed (others load files or write profiles)")
    prog = pos[0].text if pos else None
    if prog is None or any(x in prog for x in ("system", ">", "|", "@", "/inet")):
        raise Refuse("awk: program may write files or run commands (system, >, |)")


_GIT_GLOBAL_OK = frozenset("--no-pager -P --no-optional-locks --literal-pathspecs --glob-pathspecs "
                           "--noglob-pathspecs --icase-pathspecs --no-replace-objects".split())
_GIT_READ = frozenset("status log show diff blame rev-parse ls-files ls-tree cat-file describe "
                      "shortlog grep rev-list merge-base show-ref for-each-ref count-objects "
                      "name-rev branch tag remote config".split())
_GIT_BAD_LONG = ("output", "output-directory", "ext-diff", "open-files-in-pager", "paginate")
_GIT_CONFIG_READ = {"get", "get-all", "get-regexp", "get-urlmatch", "list", "l"}
_GIT_CONFIG_WRITE = {"add", "replace-all", "unset", "unset-all", "rename-section",
                     "remove-section", "e", "edit", "set"}


def _git(cmd: str, args: list[Arg], nest: Nesting) -> None:
    i = 0
    while i < len(args) and args[i].text in _GIT_GLOBAL_OK:
        i += 1
    sub = args[i].text if i < len(args) else None
    if sub is None or sub.startswith("-"):
        raise Refuse(f"git: {args[i].src if i < len(args) else 'no subcommand'}: global options "
                      "such as -c, -C and --git-dir can change what git runs")
    if sub not in _GIT_READ:
        raise Refuse(f"git {sub}: not a read-only git subcommand")
    opts, pos = scan_options(f"git {sub}", args[i + 1:], bad="O" if sub == "grep" else "",
                         bad_long=_GIT_BAD_LONG)
    keys = {k for k, _ in opts}
    words = [p.text for p in pos]
    if sub == "branch" and (not keys <= {"a", "r", "l", "v", "all", "remotes", "list", "verbose",
                                         "show-current", "no-color"}
                            or (pos and not keys & {"l", "list"})):
        raise Refuse("git branch: only listing (-a, -r, -v, --list) is read-only")
    if sub == "tag" and (not keys <= {"l", "list"} or (pos and not keys)):
        raise Refuse("git tag: only listing (no arguments or -l) is read-only")
    if sub == "remote" and not ((not pos and keys <= {"v", "verbose"})
                                or (words[:1] == ["get-url"] and len(pos) == 2)):
        raise Refuse("git remote: only listing (-v) and get-url are read-only")
    if sub == "config" and (keys & _GIT_CONFIG_WRITE or (words[:1] and words[0] in _GIT_CONFIG_WRITE)
                            or not (keys & _GIT_CONFIG_READ or words[:1] in (["get"], ["list"]))):
        raise Refuse("git config: only --get/--get-all/--get-regexp/--list are read-only")


def _env(cmd: str, args: list[Arg], nest: Nesting) -> None:
    i = 0
    while i < len(args):
        t = args[i].text
        if t is None:
            raise Refuse(f"env: {args[i].src!r} is not a literal word")
        if t in ("-u", "--unset"):
            i += 1
            if i < len(args) and args[i].text is None:
                raise Refuse("env: -u needs a literal name")
        elif t.startswith("-") and t not in ("-i", "--ignore-environment", "-0", "--null", "--") \
                and not t.startswith(("-u", "--unset=")):
            raise Refuse(f"env: option {t} is not allowed")
        elif "=" in t and not t.startswith("-"):
            check_var(t.partition("=")[0])
        elif not t.startswith("-"):
            break
        i += 1
    _run_inner(cmd, args[i:], nest, required=False)


def _xargs(cmd: str, args: list[Arg], nest: Nesting) -> None:
    _, pos = scan_options(cmd, args, takes="adEILnPs", attached="eil", bad="po",
                      bad_long=("open-tty", "interactive"), permute=False)
    if pos and pos[0].text not in _SIMPLE:
        raise Refuse(f"xargs: {pos[0].src} is not a command that is read-only for any argument")
    _run_inner(cmd, pos, nest, required=False)


def _wrapper(takes: str = "", skip: int = 0, long_takes: tuple[str, ...] = ()) -> _Rule:
    def rule(cmd: str, args: list[Arg], nest: Nesting) -> None:
        opts, pos = scan_options(cmd, args, takes=takes, long_takes=long_takes, permute=False)
        if cmd == "command" and any(k in ("v", "V") for k, _ in opts):
            return  # command -v NAME only prints
        if any(p.multi for p in pos[:skip]):
            raise Refuse(f"{cmd}: {pos[0].src!r} may expand to several words")
        _run_inner(cmd, pos[skip:], nest, required=cmd == "timeout")

    return rule


def check_test_args(cmd: str, args: list[Arg]) -> None:
    if cmd == "[" and args and args[-1].text == "]":
        args = args[:-1]
    if any(a.text in ("-v", "-R") for a in args):
        raise Refuse(f"{cmd}: -v/-R evaluate array subscripts (code) in variable contents")
    if all(a.text is not None for a in args):
        return
    n = len(args)
    if any(a.multi for a in args) or n > 3 or (n >= 2 and args[n - 2].text is None):
        raise Refuse(f"{cmd}: a non-literal argument could become a test operator")


def inner_shell_script(cmd: str, args: list[Arg]) -> str:
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
        raise Refuse(f"{cmd}: only `{cmd} -c '<literal script>'` is allowed, not a script file")
    return args[i].text  # type: ignore[return-value]


def _shell(cmd: str, args: list[Arg], nest: Nesting) -> None:
    # the inner script is checked like the outer one, by the walk that found this command
    nest.check_script(inner_shell_script(cmd, args), nest.depth + 1)


def _sed_rule(cmd: str, args: list[Arg], nest: Nesting) -> None:
    check_sed(cmd, args)


def _test_rule(cmd: str, args: list[Arg], nest: Nesting) -> None:
    check_test_args(cmd, args)


_RULES: dict[str, _Rule] = {
    "sed": _sed_rule, "find": _find, "date": _date, "hostname": _hostname, "xxd": _xxd, "awk": _awk,
    "git": _git, "env": _env, "xargs": _xargs, "test": _test_rule, "[": _test_rule,
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
