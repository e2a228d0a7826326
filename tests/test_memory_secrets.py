"""The team-memory write guard (qwenctxd.memory.secrets) over the one scanner: the original
rule samples, near misses, linear time and the refusal. The full rule table is covered by
tests/test_secrets_scanner.py."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qwenctxd.memory.secrets import RULES, GuardResult, SecretHit, check_write, scan

RULE_IDS = [rule.id for rule in RULES]
MB = 1 << 20

# Fakes are assembled at runtime so this file never contains a literal token.
B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
ALNUM = "aB3dE5gH7jK9mN1pQ2sT4vW6yZ8"


def _cycle(alphabet: str, n: int) -> str:
    return (alphabet * (n // len(alphabet) + 1))[:n]


def _rep(unit: str, n: int = MB) -> str:
    """Whole copies of ``unit`` totalling at least ``n`` chars (never a truncated tail)."""
    return unit * (n // len(unit) + 1)


PEM_BODY = "\n".join(_cycle("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC+/=", 64) for _ in range(6))

POSITIVE: dict[str, str] = {
    "aws-access-token": "key=" + "AKIA" + _cycle(B32[7:], 16) + ";",
    "alibaba-cloud-access-key": "id: " + "LTAI" + _cycle(ALNUM, 16),
    "gcp-api-key": "AIza" + _cycle(ALNUM + "_-", 35),
    "digitalocean-pat": "dop_v1_" + _cycle("0123456789abcdef", 64),
    "anthropic-api-key": "ANTHROPIC_API_KEY=" + "sk-ant-" + "api03-" + _cycle(ALNUM + "_", 40),
    "openai-api-key": "OPENAI_API_KEY=" + "sk-" + "proj-" + _cycle(ALNUM + "_-", 60),
    "huggingface-access-token": "hf_" + _cycle(ALNUM, 34),
    "github-pat": "token " + "ghp_" + _cycle(ALNUM, 36),
    "github-fine-grained-pat": "github_" + "pat_" + _cycle(ALNUM + "_", 82),
    "github-app-token": "ghs_" + _cycle(ALNUM, 36),
    "github-oauth": "gho_" + _cycle(ALNUM, 36),
    "gitlab-pat": "glpat-" + _cycle(ALNUM + "-", 20),
    "slack-bot-token": "xoxb-" + "1234567890123" + "-" + "9876543210" + "-" + _cycle(ALNUM, 24),
    "slack-app-token": "xapp-" + "1-A0B1C2D3E4F-1234567890123-" + _cycle("0123456789abcdef", 64),
    "npm-access-token": "//registry.npmjs.org/:_authToken=" + "npm_" + _cycle(ALNUM, 36),
    "stripe-access-token": "sk_" + "live_" + _cycle(ALNUM, 24),
    "private-key": "-----BEGIN PRIVATE KEY-----\n" + PEM_BODY + "\n-----END PRIVATE KEY-----\n",
}

EXTRA_POSITIVE: list[tuple[str, str]] = [
    ("aws-access-token", "A3T" + "X" + _cycle(B32, 16)),
    ("aws-access-token", "(" + "ASIA" + _cycle(B32, 16) + ")"),
    ("openai-api-key", "sk-" + _cycle(ALNUM, 20) + "T3Blbk" + "FJ" + _cycle(ALNUM, 20)),
    ("openai-api-key", "sk-" + "None-" + _cycle(ALNUM, 30) + "T3Blbk" + "FJ" + _cycle(ALNUM, 30)),
    ("openai-api-key", "token-" + "sk-" + "None-" + _cycle(ALNUM, 30) + "T3Blbk" + "FJ" + "x" * 30),
    ("openai-api-key", "sk-" + _cycle(ALNUM, 48)),
    ("openai-api-key", "sk-" + "svcacct-" + _cycle(ALNUM, 30)),
    ("github-app-token", "ghu_" + _cycle(ALNUM, 36)),
    ("stripe-access-token", "rk_" + "test_" + _cycle(ALNUM, 10)),
    ("slack-app-token", "XAPP-" + "1-ABC-1-" + "def"),
    (
        "private-key",
        "-----BEGIN RSA PRIVATE KEY-----\n" + PEM_BODY + "\n-----END RSA PRIVATE KEY-----",
    ),
    ("private-key", "-----begin ec private key-----" + "a" * 64 + "-----end ec private key-----"),
    ("private-key", "-----BEGIN PRIVATE KEY-----\n" + PEM_BODY),  # no END line: still a key
    (
        "private-key",
        "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-128-CBC,00FF\n\n"
        + PEM_BODY
        + "\n-----END RSA PRIVATE KEY-----",
    ),
    (
        "private-key",
        "-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n"
        + PEM_BODY
        + "\n-----END PGP PRIVATE KEY BLOCK-----",
    ),
]

NEAR_MISSES: list[str] = [
    "AKIA" + _cycle(B32, 15),  # one short
    "x" + "AKIA" + _cycle(B32, 16),  # no word boundary before
    "AKIA" + _cycle(B32, 16) + "x",  # no word boundary after
    "AKIA" + "0" * 16,  # 0/1/8/9 are not base32
    "AKIB" + _cycle(B32, 16),  # wrong prefix
    "LTAI" + "a" * 11,
    "LTAI" + "a" * 21,  # too long for {12,20}\b
    "AIza" + "a" * 34,
    "dop_v1_" + "a" * 63,
    "dop_v1_" + "g" * 64,  # not hex
    "sk-" + "ant-" + "a" * 19,
    "sk-" + "a" * 10,
    "sk-" + "a" * 47,
    "sk-" + "proj-" + "a" * 19,
    "sk-" + "a" * 20 + "T3Blbk" + "FJ" + "b" * 19,
    "hf_" + "a" * 33,
    "ghp_" + "a" * 35,
    "ghx_" + "a" * 36,
    "github_" + "pat_" + "a" * 81,
    "ghz_" + "a" * 36,
    "gho_" + "a" * 35 + "!",
    "glpat-" + "a" * 19,
    "xoxb-" + "1" * 9 + "-" + "1" * 10,
    "xoxp-" + "1" * 12 + "-" + "1" * 12,
    "xapp-" + "x-ABC-1-def",
    "xapp-" + "1-ABC-x-def",
    "npm_" + "a" * 35,
    "sk_" + "live_" + "a" * 9,
    "pk_" + "live_" + "a" * 24,
    "-----BEGIN PRIVATE KEY-----" + "A" * 31 + "-----END PRIVATE KEY-----",  # body < 32
    "-----BEGIN PUBLIC KEY-----\n" + PEM_BODY + "\n-----END PUBLIC KEY-----",
    "-----BEGIN CERTIFICATE-----\n" + PEM_BODY + "\n-----END CERTIFICATE-----",
    "Integration tests must hit a real database, not mocks.",
    "",
]


def test_rule_table_is_complete_and_unique() -> None:
    assert set(POSITIVE) <= set(RULE_IDS)
    assert len(set(RULE_IDS)) == len(RULE_IDS)
    assert len({rule.label for rule in RULES}) == len(RULES)
    for rule in RULES:
        assert rule.pattern.flags & re.ASCII
        assert _unbounded_quantifiers(rule.pattern.pattern) == [], rule.id


def _unbounded_quantifiers(pattern: str) -> list[str]:
    """``*``, ``+`` or ``{m,}`` outside character classes (a possessive ``}+`` is fine)."""
    src = re.sub(r"\\.", "", pattern)
    src = re.sub(r"\[\^?\]?[^\]]*\]", "", src)
    src = src.replace("}+", "}")
    return re.findall(r"[*+]|\{\d*,\}", src)


def test_unbounded_quantifier_check_itself() -> None:
    assert _unbounded_quantifiers(r"a(?:b|c)*d") == ["*"]
    assert _unbounded_quantifiers(r"[+*]x+") == ["+"]
    assert _unbounded_quantifiers(r"\+[a-z]{20,}") == ["{20,}"]
    assert _unbounded_quantifiers(r"[\]+]{1,5}+[-*]{0,3}?") == []


@pytest.mark.parametrize("rule_id", list(POSITIVE))
def test_positive_sample_fires_its_rule(rule_id: str) -> None:
    hits = scan(POSITIVE[rule_id])
    assert rule_id in [hit.rule_id for hit in hits]


@pytest.mark.parametrize(("rule_id", "text"), EXTRA_POSITIVE)
def test_extra_positive_samples(rule_id: str, text: str) -> None:
    assert rule_id in [hit.rule_id for hit in scan(text)]


def test_all_samples_together_fire_in_rule_order() -> None:
    hits = scan("\n".join(POSITIVE.values()))
    expected = [r for r in RULE_IDS if r in POSITIVE]
    assert [hit.rule_id for hit in hits] == expected
    labels = {rule.id: rule.label for rule in RULES}
    assert [hit.label for hit in hits] == [labels[r] for r in expected]


@pytest.mark.parametrize("text", NEAR_MISSES)
def test_near_misses_do_not_fire(text: str) -> None:
    assert scan(text) == []


def test_hits_never_carry_the_secret() -> None:
    for secret in [*POSITIVE.values(), *(text for _, text in EXTRA_POSITIVE)]:
        hits = scan(secret)
        assert hits
        rendered = repr(hits) + str(hits) + "".join(f"{vars(hit)}" for hit in hits)
        for piece in (secret.strip(), secret.strip()[-16:], PEM_BODY[:16]):
            assert piece not in rendered
        assert set(vars(hits[0])) == {"rule_id", "label"}


# --- linear time ------------------------------------------------------------------------

ADVERSARIAL: list[tuple[str, str, Callable[[], str]]] = [
    ("aws-access-token", "prefix+17 base32, no boundary", lambda: _rep(" AKIA" + "Q" * 17)),
    ("aws-access-token", "AKIA run", lambda: _rep("AKIA")),
    ("alibaba-cloud-access-key", "LTAI+21", lambda: _rep(" LTAI" + "a" * 21)),
    ("gcp-api-key", "AIza+34", lambda: _rep("AIza" + "-" * 34 + "!")),
    ("digitalocean-pat", "dop_v1_+63", lambda: _rep("dop_v1_" + "a" * 63 + "g")),
    ("anthropic-api-key", "sk-ant-+19", lambda: _rep("sk-ant-" + "a" * 19 + "!")),
    ("openai-api-key", "sk- run", lambda: _rep("sk-")),
    ("openai-api-key", "sk- + 1 MB a- no marker", lambda: "sk-" + _rep("a-", MB - 3)),
    ("openai-api-key", "partial marker", lambda: _rep("sk-" + "a-" * 15 + "T3BlbkF")),
    (
        "openai-api-key",
        "marker, short tail",
        lambda: _rep("sk-" + "a" * 20 + "T3Blbk" + "FJ" + "b" * 19 + "!"),
    ),
    ("huggingface-access-token", "hf_+33", lambda: _rep("hf_" + "a" * 33 + "!")),
    ("github-pat", "ghp_+35", lambda: _rep("ghp_" + "a" * 35 + "_")),
    (
        "github-fine-grained-pat",
        "github_pat_+81",
        lambda: _rep("github_" + "pat_" + "a" * 81 + "-"),
    ),
    ("github-app-token", "ghs_+35", lambda: _rep("ghs_" + "a" * 35 + "-")),
    ("github-oauth", "gho_+35", lambda: _rep("gho_" + "a" * 35 + "-")),
    ("gitlab-pat", "glpat-+19", lambda: _rep("glpat-" + "a" * 19 + "!")),
    (
        "slack-bot-token",
        "xoxb- digits, short tail",
        lambda: _rep("xoxb-" + "1" * 13 + "-" + "1" * 9 + "x"),
    ),
    ("slack-bot-token", "xoxb- long digits", lambda: _rep("xoxb-" + "1" * 40)),
    ("slack-app-token", "one start + 1 MB run", lambda: "xapp-1-" + "A" * (MB - 7)),
    (
        "slack-app-token",
        "missing last part",
        lambda: _rep("xapp-1-" + "A" * 40 + "-" + "1" * 40 + "!"),
    ),
    ("npm-access-token", "npm_+35", lambda: _rep("npm_" + "a" * 35 + "_")),
    ("stripe-access-token", "sk_live_+9", lambda: _rep("sk_" + "live_" + "a" * 9 + "!")),
    ("private-key", "header run", lambda: _rep("-----BEGIN PRIVATE KEY-----")),
    ("private-key", "BEGIN run", lambda: _rep("-----BEGIN")),
    ("private-key", "BEGIN + 100 label chars", lambda: _rep("-----BEGIN" + "P" * 100 + " ")),
    ("private-key", "dash run", lambda: "-" * MB),
]


@pytest.mark.parametrize(
    ("rule_id", "text_factory"),
    [pytest.param(r, f, id=f"{r}:{name}") for r, name, f in ADVERSARIAL],
)
def test_adversarial_input_scans_in_linear_time(
    rule_id: str, text_factory: Callable[[], str]
) -> None:
    text = text_factory()
    assert len(text) >= MB
    start = time.perf_counter()
    hits = scan(text)
    elapsed = time.perf_counter() - start
    assert rule_id not in [hit.rule_id for hit in hits]
    # a liveness bound (the figures are in bench/secrets.py): backtracking over 1 MiB would
    # take minutes to hours, a linear scan well under a second on an idle machine
    assert elapsed < 10.0, f"{rule_id}: {elapsed * 1000:.1f} ms"


def test_every_original_rule_has_an_adversarial_case() -> None:
    assert {rule_id for rule_id, _, _ in ADVERSARIAL} == set(POSITIVE)


@pytest.mark.parametrize("text", [
    "-----BEGIN PRIVATE KEY-----" + "A" * MB,
    "-----BEGIN PRIVATE KEY-----" + _rep("A-"),
    _rep("-----BEGIN RSA PRIVATE KEY-----\n" + "A" * 200 + "\n-----END RSA PRIVATE"),
], ids=["1 MB body no END", "1 MB single dashes", "body then partial END"])
def test_pem_without_end_is_found_in_linear_time(text: str) -> None:
    start = time.perf_counter()
    assert "private-key" in [hit.rule_id for hit in scan(text)]
    assert time.perf_counter() - start < 2.0


# --- properties -------------------------------------------------------------------------

FRAGMENTS = [
    "AKIA",
    "A3T",
    "LTAI",
    "AIza",
    "dop_v1_",
    "sk-",
    "ant-",
    "proj-",
    "T3BlbkFJ",
    "hf_",
    "ghp_",
    "github_pat_",
    "ghs_",
    "gho_",
    "glpat-",
    "xoxb-",
    "xapp-",
    "npm_",
    "sk_live_",
    "-----BEGIN ",
    "PRIVATE KEY",
    "-----",
    "-----END ",
    " BLOCK",
    "-",
    "_",
    " ",
    "\n",
    "a",
    "Z",
    "7",
    "0123456789",
    "abcdefghij",
    "QRSTUVWXYZ",
    "\u00e9",
    "\U0001f600",
]


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(), st.lists(st.sampled_from(FRAGMENTS), max_size=80).map("".join)))
def test_scan_never_raises_and_reports_known_rules(text: str) -> None:
    hits = scan(text)
    ids = [hit.rule_id for hit in hits]
    assert set(ids) <= set(RULE_IDS) | {"aws-secret-access-key", "generic-password"}
    assert len(ids) == len(set(ids))  # one hit per rule
    assert all(isinstance(hit, SecretHit) for hit in hits)


@settings(max_examples=300, deadline=None)
@given(st.text(), st.sampled_from(list(POSITIVE)), st.text())
def test_sample_embedded_in_noise_still_fires(before: str, rule_id: str, after: str) -> None:
    assert rule_id in [hit.rule_id for hit in scan(f"{before} {POSITIVE[rule_id]} {after}")]


# --- write guard ------------------------------------------------------------------------


def _team_predicate(team_dir: Path) -> Callable[[Path], bool]:
    def is_team(path: Path) -> bool:
        return path.resolve().is_relative_to(team_dir.resolve())

    return is_team


def test_check_write_refuses_secret_in_team_memory(tmp_path: Path) -> None:
    team = tmp_path / "repo" / ".qwen" / "team-memory"
    content = "Deploy with:\n" + POSITIVE["github-pat"] + "\n" + POSITIVE["aws-access-token"]
    result = check_write(
        team / "project" / "deploy.md", content, is_team_path=_team_predicate(team)
    )
    assert isinstance(result, GuardResult)
    assert result.allowed is False
    assert [hit.rule_id for hit in result.rules] == ["aws-access-token", "github-pat"]
    assert result.message is not None
    assert "(AWS Access Token, GitHub PAT)" in result.message
    assert "cannot be written to team memory" in result.message
    for secret in (POSITIVE["github-pat"].split()[-1], POSITIVE["aws-access-token"][4:-1]):
        assert secret not in result.message
        assert secret not in repr(result)


def test_check_write_allows_same_content_outside_team_memory(tmp_path: Path) -> None:
    team = tmp_path / "repo" / ".qwen" / "team-memory"
    content = POSITIVE["private-key"]
    result = check_write(
        tmp_path / "home" / ".qwen" / "memories" / "key.md",
        content,
        is_team_path=_team_predicate(team),
    )
    assert result == GuardResult(allowed=True, rules=[], message=None)


def test_check_write_allows_clean_team_content(tmp_path: Path) -> None:
    team = tmp_path / "team"
    result = check_write(team / "a.md", "Use pnpm, not npm.", is_team_path=_team_predicate(team))
    assert result.allowed and result.rules == [] and result.message is None


def test_non_team_paths_are_not_scanned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import qwenctxd.memory.secrets as mod

    def boom(text: str) -> list[SecretHit]:
        raise AssertionError("scanned a non-team path")

    monkeypatch.setattr(mod, "scan", boom)
    assert check_write(tmp_path / "x.md", "x", is_team_path=lambda p: False).allowed


def test_unclassifiable_path_fails_closed(tmp_path: Path) -> None:
    def broken(path: Path) -> bool:
        raise OSError("loop")

    result = check_write(tmp_path / "x.md", POSITIVE["npm-access-token"], is_team_path=broken)
    assert result.allowed is False
    assert [hit.rule_id for hit in result.rules] == ["npm-access-token"]
