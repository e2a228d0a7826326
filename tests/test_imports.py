"""@import processing: token scan, code regions, validation, tree/flat formats, limits."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwenctxd.instructions.imports import (
    ImportResult,
    code_regions,
    find_imports,
    process_imports,
)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "proj"
    (r / ".git").mkdir(parents=True)
    (r / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return r


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def run(root: Path, text: str, **kw: object) -> ImportResult:
    main = write(root / "QWEN.md", text)
    return process_imports(text, root, project_root=root, current_file=main, **kw)  # type: ignore[arg-type]


def kinds(res: ImportResult) -> list[str]:
    return [p.kind for p in res.problems]


# ------------------------------------------------------------------------ find_imports


def test_find_imports_token_rules() -> None:
    text = "@./a.md x @/abs/b.md\t@c.md\n@d/e.md a@b.com @1x @~/x @ @-y (@./z) @@./q"
    assert [p for _, _, p in find_imports(text)] == ["./a.md", "/abs/b.md", "c.md", "d/e.md"]
    for start, end, path in find_imports(text):
        assert text[start:end] == "@" + path


def test_find_imports_path_runs_to_whitespace_only() -> None:
    assert find_imports("see @./x.md, then\r\n@./y.md.") == [
        (4, 12, "./x.md,"),
        (19, 27, "./y.md."),
    ]
    assert find_imports("\u00e9@./x.md @\u00e9.md") == []  # non-ASCII letter is not accepted


# ------------------------------------------------------------------------ code_regions


def _covered(text: str, needle: str, nth: int = 0) -> bool:
    pos = -1
    for _ in range(nth + 1):
        pos = text.index(needle, pos + 1)
    return any(s <= pos < e for s, e in code_regions(text))


def test_code_regions_blocks_and_spans() -> None:
    text = (
        "para `@./a.md` and ``x ` @./b.md`` end @./c.md\n"
        "\n"
        "```\n@./d.md\n```\n"
        "\n"
        "~~~md\n@./e.md\n~~~\n"
        "\n"
        "    @./f.md indented\n"
        "\n"
        "> quote `@./g.md`\n"
        "- item\n\n  ```\n  @./h.md\n  ```\n"
    )
    for name in "abdefgh":
        assert _covered(text, f"@./{name}.md"), name
    assert not _covered(text, "@./c.md")
    for s, e in code_regions(text):
        assert 0 <= s < e <= len(text)


def test_code_regions_repeated_spans_map_to_their_own_occurrence() -> None:
    text = "`x` @./a.md `x` @./a.md `@./a.md`"
    regions = code_regions(text)
    assert regions == [(0, 3), (12, 15), (24, 33)]
    assert not _covered(text, "@./a.md", 0)
    assert not _covered(text, "@./a.md", 1)
    assert _covered(text, "@./a.md", 2)


def test_code_regions_crlf_lone_cr_and_multiline_span() -> None:
    text = "a\r\n```\r\n@./x.md\r\n```\r\nb\r`c\r@./y.md` @./z.md"
    assert _covered(text, "@./x.md")
    assert _covered(text, "@./y.md")
    assert not _covered(text, "@./z.md")
    quoted = "> one `two\n> @./q.md` three @./r.md"
    assert _covered(quoted, "@./q.md")
    assert not _covered(quoted, "@./r.md")


def test_code_regions_escaped_backtick_is_not_a_span() -> None:
    text = r"\`@./a.md\` and `@./b.md`"
    assert not _covered(text, "@./a.md")
    assert _covered(text, "@./b.md")


# ------------------------------------------------------------------------ tree format


def test_tree_success_and_code_regions_stay_verbatim(root: Path) -> None:
    x = write(root / "x.md", "X body\n")
    text = (
        "inline `@./x.md` here\n\n"
        "```\n@./x.md\n```\n\n"
        "~~~\n@./x.md\n~~~\n\n"
        "    @./x.md\n\n"
        "real: @./x.md\n"
    )
    res = run(root, text)
    expected_import = (
        "<!-- Imported from: ./x.md -->\nX body\n\n<!-- End of import from: ./x.md -->"
    )
    assert res.text == text.replace("real: @./x.md", "real: " + expected_import)
    assert res.text.count("@./x.md") == 4
    assert res.imports == [x]
    assert res.problems == []


def test_tree_nested_relative_to_importing_file(root: Path) -> None:
    write(root / "docs" / "a.md", "A @./sub/b.md")
    b = write(root / "docs" / "sub" / "b.md", "B @../c.md")
    c = write(root / "docs" / "c.md", "C")
    res = run(root, "@docs/a.md")
    assert res.text == (
        "<!-- Imported from: docs/a.md -->\n"
        "A <!-- Imported from: ./sub/b.md -->\n"
        "B <!-- Imported from: ../c.md -->\nC\n<!-- End of import from: ../c.md -->"
        "\n<!-- End of import from: ./sub/b.md -->"
        "\n<!-- End of import from: docs/a.md -->"
    )
    assert res.imports == [root / "docs" / "a.md", b, c]


def test_tree_cycle(root: Path) -> None:
    write(root / "a.md", "A @./b.md")
    write(root / "b.md", "B @./a.md")
    res = run(root, "@./a.md")
    assert "<!-- File already processed: ./a.md -->" in res.text
    assert res.text.count("A ") == 1
    assert kinds(res) == ["cycle"]
    assert res.problems[0].file == str(root / "b.md")
    assert res.problems[0].target == "./a.md"


def test_tree_self_import_of_root_file_is_a_cycle(root: Path) -> None:
    res = run(root, "me @./QWEN.md")
    assert res.text == "me <!-- File already processed: ./QWEN.md -->"
    assert kinds(res) == ["cycle"]


def test_tree_diamond_includes_shared_file_twice(root: Path) -> None:
    write(root / "a.md", "@./b.md @./c.md")
    write(root / "b.md", "@./d.md")
    write(root / "c.md", "@./d.md")
    d = write(root / "d.md", "DDD")
    res = run(root, "@./a.md")
    assert res.text.count("DDD") == 2
    assert res.imports.count(d) == 1
    assert res.problems == []


def test_tree_traversal_refused(root: Path) -> None:
    res = run(root, "x @../../etc/passwd y @/etc/hostname")
    assert res.text == (
        "x <!-- Import failed: ../../etc/passwd - Path traversal attempt --> "
        "y <!-- Import failed: /etc/hostname - Path traversal attempt -->"
    )
    assert kinds(res) == ["traversal", "traversal"]
    assert res.imports == []
    nul = run(root, "@./QW\x00EN.md")
    assert nul.text == "<!-- Import failed: ./QW\x00EN.md - Path traversal attempt -->"
    assert kinds(nul) == ["traversal"]


def test_tree_dotdot_staying_inside_root_is_fine(root: Path) -> None:
    write(root / "a" / "b.md", "B")
    write(root / "c.md", "C")
    res = process_imports(
        "@../c.md", root / "a", project_root=root, current_file=root / "a" / "b.md"
    )
    assert "C" in res.text and res.problems == []


def test_tree_symlink_escaping_root_refused(root: Path) -> None:
    os.symlink("/etc/hostname", root / "host.md")
    outside = write(root.parent / "secret.md", "TOP SECRET")
    os.symlink(outside, root / "sec.md")
    os.symlink(root.parent, root / "up")
    res = run(root, "@./host.md @./sec.md @up/secret.md")
    assert "TOP SECRET" not in res.text
    assert res.text.count("Path traversal attempt") == 3
    assert kinds(res) == ["traversal"] * 3


def test_tree_symlink_within_root_allowed(root: Path) -> None:
    write(root / "real.md", "REAL")
    os.symlink(root / "real.md", root / "link.md")
    res = run(root, "@./link.md")
    assert "REAL" in res.text
    assert res.imports == [root / "link.md"]


def test_tree_urls_refused(root: Path) -> None:
    res = run(root, "@https://x.org/a.md @http://x.org/b @file:///etc/passwd")
    assert res.text == (
        "<!-- Import failed: https://x.org/a.md - Path traversal attempt --> "
        "<!-- Import failed: http://x.org/b - Path traversal attempt --> "
        "<!-- Import failed: file:///etc/passwd - Path traversal attempt -->"
    )
    assert kinds(res) == ["url"] * 3


def test_tree_missing_file_keeps_text(root: Path) -> None:
    write(root / "f.md", "F")
    text = "ping @alice about it, @./nope.md, and @./f.md/sub"
    res = run(root, text)
    assert res.text == text and res.imports == []
    # a missing path-like target is a problem (a mistyped @import); a mention is not
    assert [(p.target, p.kind) for p in res.problems] == [("./nope.md,", "missing"),
                                                          ("./f.md/sub", "missing")]


def test_email_is_not_an_import(root: Path) -> None:
    write(root / "b.com", "SHOULD NOT APPEAR")
    text = "mail a@b.com now"
    res = run(root, text)
    assert res.text == text and res.imports == []


def test_tree_unreadable_directory_and_bad_utf8(root: Path) -> None:
    (root / "x.md").mkdir()
    write(root / "bad.md", b"ok \xff\xfe broken")
    res = run(root, "@./x.md @./bad.md")
    assert res.text == (
        "<!-- Import failed: ./x.md - is a directory --> "
        "<!-- Import failed: ./bad.md - not valid UTF-8 -->"
    )
    assert kinds(res) == ["unreadable", "unreadable"]


def test_tree_fifo_is_unreadable_not_a_hang(root: Path) -> None:
    os.mkfifo(root / "pipe.md")
    res = run(root, "@./pipe.md")
    assert "Import failed: ./pipe.md" in res.text
    assert kinds(res) == ["unreadable"]


def _chain(root: Path, n: int) -> None:
    for i in range(1, n + 1):
        nxt = f" @./a{i + 1}.md" if i < n else ""
        write(root / f"a{i}.md", f"BODY{i}{nxt}")


def test_tree_depth_limit(root: Path) -> None:
    _chain(root, 6)
    res = run(root, "BODY0 @./a1.md")
    for i in range(6):
        assert f"BODY{i}" in res.text
    assert "BODY6" not in res.text
    assert "BODY5 @./a6.md" in res.text
    assert res.imports == [root / f"a{i}.md" for i in range(1, 6)]
    assert kinds(res) == ["depth"]
    assert res.problems[0].file == str(root / "a5.md")
    assert res.problems[0].target == "./a6.md"


def test_tree_depth_zero_and_no_problem_without_imports(root: Path) -> None:
    _chain(root, 2)
    assert run(root, "@./a1.md", max_depth=0).text == "@./a1.md"
    res = run(root, "@./a1.md", max_depth=2)
    assert "BODY2" in res.text and res.problems == []


def test_size_cap_truncates_on_utf8_boundary(root: Path) -> None:
    write(root / "big.md", "é" * 10 + "tail")  # 2 bytes each
    res = run(root, "@./big.md", max_file_bytes=7)
    body = res.text.split("\n")[1:3]
    assert body == ["ééé", "[... truncated: ./big.md is 24 bytes, over the 7-byte cap ...]"]
    assert kinds(res) == ["too_large"]
    assert res.imports == [root / "big.md"]


def test_size_cap_with_injected_reader(root: Path) -> None:
    calls: list[Path] = []

    def reader(p: Path) -> str:
        calls.append(p)
        if p.name == "gone.md":
            raise FileNotFoundError(p)
        return "abcdefghij"

    res = process_imports(
        "@./a.md @./gone.md", root, project_root=root, max_file_bytes=4, read=reader
    )
    assert res.text == (
        "<!-- Imported from: ./a.md -->\nabcd\n"
        "[... truncated: ./a.md is 10 bytes, over the 4-byte cap ...]"
        "\n<!-- End of import from: ./a.md --> @./gone.md"
    )
    assert calls == [root / "a.md", root / "gone.md"]
    assert res.problems[0].file == ""


def test_unknown_format_is_a_programming_error(root: Path) -> None:
    with pytest.raises(ValueError):
        process_imports("x", root, project_root=root, fmt="json")  # type: ignore[arg-type]


# ------------------------------------------------------------------------ flat format


def test_flat_lists_each_file_once_in_first_encounter_order(root: Path) -> None:
    write(root / "a.md", "A\n@./b.md @./c.md\n")
    write(root / "b.md", "B @./d.md @./a.md")
    write(root / "c.md", "C @./d.md @./nope.md")
    write(root / "docs" / "d.md", "unused")
    write(root / "d.md", "\n  D  \n")
    text = "root @./a.md `@./c.md` @../x.md\n"
    res = run(root, text, fmt="flat")
    assert res.text == "\n\n".join(
        [
            "root @./a.md `@./c.md` @../x.md",
            "--- File: a.md ---\nA\n@./b.md @./c.md\n--- End of File: a.md ---",
            "--- File: b.md ---\nB @./d.md @./a.md\n--- End of File: b.md ---",
            "--- File: d.md ---\nD\n--- End of File: d.md ---",
            "--- File: c.md ---\nC @./d.md @./nope.md\n--- End of File: c.md ---",
        ]
    )
    assert res.imports == [root / n for n in ("a.md", "b.md", "d.md", "c.md")]
    assert sorted(kinds(res)) == ["missing", "traversal"]  # missing: c.md's @./nope.md


def test_flat_paths_relative_to_root_with_subdirs(root: Path) -> None:
    write(root / "docs" / "a.md", "A @../lib/b.md")
    write(root / "lib" / "b.md", "B")
    res = process_imports(
        "@./a.md",
        root / "docs",
        project_root=root,
        current_file=root / "docs" / "QWEN.md",
        fmt="flat",
    )
    assert "--- File: docs/a.md ---" in res.text
    assert "--- File: lib/b.md ---\nB\n--- End of File: lib/b.md ---" in res.text


def test_flat_depth_limit_and_shallowest_wins(root: Path) -> None:
    _chain(root, 6)
    res = run(root, "@./a1.md", fmt="flat")
    assert [p.name for p in res.imports] == [f"a{i}.md" for i in range(1, 6)]
    assert kinds(res) == ["depth"]
    # a2 is first reached at the cap (root -> a1 -> a2, not expanded), then directly from
    # the root at depth 1: the shallower visit expands it, so a3 comes in and a2 is no
    # longer reported.
    res = run(root, "@./a1.md @./a2.md", fmt="flat", max_depth=2)
    assert [p.name for p in res.imports] == ["a1.md", "a2.md", "a3.md"]
    assert [(p.kind, Path(p.file).name) for p in res.problems] == [("depth", "a3.md")]
    res = run(root, "@./a1.md", fmt="flat", max_depth=2)
    assert [p.name for p in res.imports] == ["a1.md", "a2.md"]
    assert [(p.kind, Path(p.file).name) for p in res.problems] == [("depth", "a2.md")]


def test_flat_refusals_and_unreadable(root: Path) -> None:
    (root / "dir.md").mkdir()
    os.symlink("/etc/hostname", root / "host.md")
    res = run(root, "@./dir.md @./host.md @https://e.com/x", fmt="flat")
    assert res.text == "@./dir.md @./host.md @https://e.com/x"
    assert sorted(kinds(res)) == ["traversal", "unreadable", "url"]


# ------------------------------------------------------------------------ fuzz


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("fuzz")
    r = base / "proj"
    (r / ".git").mkdir(parents=True)
    write(base / "outside.md", "OUTSIDE-SECRET @./proj/a.md")
    write(r / "a.md", "alpha @./b.md `@./c.md` @../outside.md")
    write(r / "b.md", "beta @./a.md @./sub/c.md @/etc/passwd")
    write(r / "sub" / "c.md", "gamma @../a.md @../../outside.md\n```\n@./x\n```")
    write(r / "bad.md", b"\xff")
    (r / "dir.md").mkdir()
    os.symlink(base / "outside.md", r / "link.md")
    os.symlink(base, r / "up")
    return r


_PIECES = st.sampled_from(
    [
        "@./a.md",
        "@./b.md",
        "@sub/c.md",
        "@../outside.md",
        "@up/outside.md",
        "@./link.md",
        "@/etc/passwd",
        "@./bad.md",
        "@./dir.md",
        "@http://x",
        "@file:///etc",
        "@./missing",
        "@",
        "@@./a.md",
        "a@b.md",
        "`",
        "``",
        "```",
        "~~~",
        "\n",
        "\r",
        "\r\n",
        " ",
        "\t",
        "    ",
        "> ",
        "- ",
        "\\",
        "text",
        "\x00",
        "é",
        "@./a.md\x00",
        "[l](",
        ")",
        "<",
        ">",
    ]
)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    pieces=st.lists(st.one_of(_PIECES, st.text(max_size=5)), max_size=40),
    fmt=st.sampled_from(["tree", "flat"]),
    depth=st.integers(0, 4),
)
def test_fuzz_never_raises_never_escapes(
    fuzz_root: Path, pieces: list[str], fmt: str, depth: int
) -> None:
    text = "".join(pieces)
    real_root = os.path.realpath(fuzz_root)
    read_calls: list[Path] = []

    def reader(p: Path) -> str:
        read_calls.append(p)
        return p.read_bytes().decode("utf-8")

    for rd in (None, reader):
        res = process_imports(
            text,
            fuzz_root,
            project_root=fuzz_root,
            current_file=fuzz_root / "QWEN.md",
            fmt=fmt,
            max_depth=depth,
            max_file_bytes=64,
            read=rd,  # type: ignore[arg-type]
        )
        assert isinstance(res.text, str)
        assert "OUTSIDE-SECRET" not in res.text
        for p in [*res.imports, *read_calls]:
            assert os.path.realpath(p).startswith(real_root + os.sep)
        assert len(set(res.imports)) == len(res.imports)
    for start, end, path in find_imports(text):
        assert text[start:end] == "@" + path
    for s, e in code_regions(text):
        assert 0 <= s < e <= len(text)
