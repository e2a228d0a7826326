"""The secret rule table: gitleaks rule ids and shapes, bounded for a backtracking engine.

Source of truth: the gitleaks default config (``config/gitleaks.toml``, MIT licence,
https://github.com/gitleaks/gitleaks). Rule ids are gitleaks' where gitleaks has the rule
(``aws-access-token``, ``github-pat``, ``slack-webhook-url``, ``jwt``, ``private-key`` …); the
few rules gitleaks has no id for take a name in the same style and are marked ``(ours)``:
``aws-secret-access-key`` (detect-secrets' ``AWSKeyDetector`` looks for it in context, as we
do), ``url-credentials`` (detect-secrets' ``BasicAuthDetector``), ``azure-storage-account-key``,
``azure-connection-string``, ``generic-password``. The regexes are re-written, not copied: every
quantifier is bounded, runs before a suffix they cannot contain are possessive, and all use
``re.ASCII`` (the scanner normalises text to ASCII look-alikes first).

A rule's ``group`` names the capture group that is the secret (0: the whole match): redaction
replaces only that span, so ``postgres://u:PW@host`` keeps its user and host. ``check`` (when
set) vets the secret (entropy, placeholders) and may rename the rule (``generic-api-key`` →
``aws-secret-access-key`` for an AWS-named key).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["RULES", "Rule", "entropy", "generic_verdict", "is_placeholder"]

_A = re.ASCII
_AI = re.ASCII | re.IGNORECASE
_T = 512  # long API tokens
_PEM_BODY_MAX = 16384
_PEM_LABEL = r"[ A-Z0-9_]{0,100}PRIVATE KEY(?: BLOCK)?-----"

Check = Callable[[re.Match[str]], "str | None | bool"]


@dataclass(frozen=True)
class Rule:
    """One detection rule: stable id, label, compiled pattern, secret group, optional check."""

    id: str
    label: str
    pattern: re.Pattern[str] = field(repr=False)
    group: int = 0
    check: Check | None = field(default=None, repr=False)
    # a literal every match contains (lower case): the rule is skipped when it is absent
    needle: str | None = None


def entropy(value: str) -> float:
    """Shannon entropy in bits per character."""
    if not value:
        return 0.0
    n = len(value)
    return -sum(c / n * math.log2(c / n) for c in Counter(value).values())


_PLACEHOLDER = re.compile(
    r"^(?:\$\{?|%\(?|\{\{|<|\[redacted|\*{3}|x{4}|X{4}|\.{3}|process\.env|os\.environ"
    r"|env\(|getenv|secrets\.|vault:|your[_-]|my[_-]|example|changeme|placeholder|dummy"
    r"|redacted|none$|null$|nil$|true$|false$|undefined$|required$|optional$|string$"
    r"|str$|bool$|int$|number$|secret$|password$|token$|hidden$|empty$|todo)",
    re.IGNORECASE,
)


def is_placeholder(value: str) -> bool:
    """A value that stands for a secret rather than being one (``${X}``, ``<your-token>``)."""
    return bool(_PLACEHOLDER.match(value)) or len(set(value)) <= 2


_PASSWORD_WORDS = ("password", "passwd", "pwd", "pass", "secret")
_TOKEN_WORDS = ("token", "apikey", "api_key", "accesskey", "access_key", "auth", "secretkey",
                "secret_key", "credential", "credentials", "privatekey", "private_key",
                "clientsecret", "client_secret", "authtoken", "auth_token")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEGMENTS = re.compile(r"[^a-z0-9]+")


def _segments(key: str) -> list[str]:
    return [s for s in _SEGMENTS.split(_CAMEL.sub("_", key).lower()) if s]


_KEYWORD = re.compile(r"pass|pwd|secret|token|key|auth|credential", re.IGNORECASE)


def key_kind(key: str) -> str | None:
    """``"password"``, ``"token"`` or None: what an assignment's key says its value is."""
    if not _KEYWORD.search(key):
        return None  # most keys ("name:", "Note:") never reach the segment test
    segs = _segments(key)
    if not segs:
        return None
    joined = "_".join(segs)
    pairs = {a + "_" + b for a, b in zip(segs, segs[1:], strict=False)} | set(segs)
    if any(w in pairs or w.replace("_", "") in pairs for w in _TOKEN_WORDS) \
            or joined.endswith("_key") and len(segs) >= 2 and segs[-2] in ("api", "access",
                                                                            "secret", "private"):
        return "token"
    if any(w in segs for w in _PASSWORD_WORDS):
        return "password"
    return None


def generic_verdict(key: str, value: str) -> str | None:
    """The rule id a ``key = value`` assignment fires, or None (placeholder, low entropy …)."""
    kind = key_kind(key)
    if kind is None or is_placeholder(value):
        return None
    segs = _segments(key)
    if "aws" in segs and "secret" in segs and len(value) == 40 and entropy(value) >= 3.5:
        return "aws-secret-access-key"
    if kind == "password":
        if len(value) < 6 or entropy(value) < 2.3:
            return None
        if value.isalpha() and value.islower() and len(value) < 16:
            return None  # a word ("password: required"), not a password
        return "generic-password"
    if len(value) < 12 or entropy(value) < 3.0:
        return None
    if value.isalpha() and (value.islower() or value.isupper()):
        return None
    return "generic-api-key"


def _generic_check(m: re.Match[str]) -> str | None:
    return generic_verdict(m.group(1), m.group(3))


def _url_check(m: re.Match[str]) -> bool:
    pw = m.group(1)
    return not is_placeholder(pw) and pw.lower() not in ("pass", "pw", "pwd")


def _hex_mixed(m: re.Match[str]) -> bool:
    return entropy(m.group(0)) >= 3.0


def _jwt_check(m: re.Match[str]) -> bool:
    return entropy(m.group(0)) >= 3.5


def _r(rule_id: str, label: str, pattern: str, flags: int = _A, *, group: int = 0,
       check: Check | None = None, needle: str | None = None) -> Rule:
    return Rule(rule_id, label, re.compile(pattern, flags), group, check, needle)


_B = r"(?<![A-Za-z0-9_])"  # a token starts here (no identifier character before it)
_E = r"(?![A-Za-z0-9_])"  # and ends here

RULES: tuple[Rule, ...] = (
    _r("private-key", "Private Key",
       # body never holds "--": the possessive run stops at the next marker; END is optional
       rf"-----BEGIN{_PEM_LABEL}(?:[^-]|-(?!-)){{32,{_PEM_BODY_MAX}}}+(?:-----END{_PEM_LABEL})?",
       _AI, needle="private key"),
    _r("aws-access-token", "AWS Access Token",
       r"\b(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}\b"),
    _r("github-pat", "GitHub PAT", rf"{_B}ghp_[0-9a-zA-Z]{{36}}{_E}", needle="ghp_"),
    _r("github-oauth", "GitHub OAuth", rf"{_B}gho_[0-9a-zA-Z]{{36}}{_E}", needle="gho_"),
    _r("github-app-token", "GitHub App Token", rf"{_B}(?:ghu|ghs)_[0-9a-zA-Z]{{36}}{_E}"),
    _r("github-refresh-token", "GitHub Refresh Token", rf"{_B}ghr_[0-9a-zA-Z]{{36}}{_E}",
       needle="ghr_"),
    _r("github-fine-grained-pat", "GitHub Fine Grained PAT", r"github_pat_\w{82}",
       needle="github_pat_"),
    _r("gitlab-pat", "GitLab PAT", r"glpat-[\w-]{20}", needle="glpat-"),
    _r("gitlab-ptt", "GitLab Pipeline Trigger Token", r"glptt-[0-9a-f]{40}", needle="glptt-"),
    _r("gitlab-rrt", "GitLab Runner Registration Token", r"GR1348941[\w-]{20}",
       needle="gr1348941"),
    _r("slack-bot-token", "Slack Bot Token",
       rf"xoxb-[0-9]{{10,13}}-[0-9]{{10,13}}[a-zA-Z0-9-]{{0,{_T}}}", needle="xoxb-"),
    _r("slack-user-token", "Slack User Token",
       r"xox[pe](?:-[0-9]{10,13}){3}-[a-zA-Z0-9-]{28,34}", needle="xox"),
    _r("slack-app-token", "Slack App Token",
       rf"xapp-[0-9]-[A-Z0-9]{{1,{_T}}}+-[0-9]{{1,{_T}}}+-[a-z0-9]{{1,{_T}}}", _AI,
       needle="xapp-"),
    _r("slack-webhook-url", "Slack Webhook URL",
       r"hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9+/]{43,56}",
       _AI, needle="hooks.slack.com"),
    _r("stripe-access-token", "Stripe Access Token",
       r"(?:sk|rk)_(?:test|live|prod)_[a-zA-Z0-9]{10,99}"),
    _r("gcp-api-key", "GCP API Key", r"AIza[\w-]{35}", needle="aiza"),
    _r("gcp-oauth-client-secret", "GCP OAuth Client Secret", r"GOCSPX-[\w-]{28}",
       needle="gocspx-"),
    _r("azure-storage-account-key", "Azure Storage Account Key",
       r"AccountKey=([A-Za-z0-9+/]{86,88}={0,2})", _AI, group=1, needle="accountkey="),
    _r("azure-connection-string", "Azure Shared Access Key",
       r"SharedAccessKey=([A-Za-z0-9+/]{40,88}={0,2})", _AI, group=1,
       needle="sharedaccesskey="),
    _r("sendgrid-api-token", "SendGrid API Token", r"SG\.[\w-]{22}\.[\w-]{43}", needle="sg."),
    _r("twilio-api-key", "Twilio API Key", rf"{_B}SK[0-9a-fA-F]{{32}}{_E}", check=_hex_mixed),
    _r("telegram-bot-api-token", "Telegram Bot API Token",
       r"(?<![0-9])[0-9]{5,16}:A[\w-]{34}(?![\w-])"),
    _r("shopify-access-token", "Shopify Access Token", r"shpat_[a-fA-F0-9]{32}",
       needle="shpat_"),
    _r("shopify-custom-access-token", "Shopify Custom Access Token", r"shpca_[a-fA-F0-9]{32}",
       needle="shpca_"),
    _r("shopify-private-app-access-token", "Shopify Private App Access Token",
       r"shppa_[a-fA-F0-9]{32}", needle="shppa_"),
    _r("shopify-shared-secret", "Shopify Shared Secret", r"shpss_[a-fA-F0-9]{32}",
       needle="shpss_"),
    _r("anthropic-api-key", "Anthropic API Key", rf"sk-ant-[a-zA-Z0-9_-]{{20,{_T}}}",
       needle="sk-ant-"),
    _r("openai-api-key", "OpenAI API Key",
       r"sk-(?:"
       rf"(?:proj|svcacct|admin)-[a-zA-Z0-9_-]{{20,{_T}}}"
       rf"|(?:[a-rt-zA-SU-Z0-9-]|s(?!k-)|T(?!3BlbkFJ)){{20,{_T}}}+"
       rf"T3BlbkFJ[a-zA-Z0-9-]{{20,{_T}}}"
       r"|[a-zA-Z0-9]{48})", needle="sk-"),
    _r("huggingface-access-token", "HuggingFace Access Token", rf"hf_[a-zA-Z0-9]{{34,{_T}}}",
       needle="hf_"),
    _r("huggingface-organization-api-token", "HuggingFace Organization API Token",
       r"api_org_[a-zA-Z0-9]{34}", needle="api_org_"),
    _r("npm-access-token", "NPM Access Token", r"npm_[a-zA-Z0-9]{36}", needle="npm_"),
    _r("pypi-upload-token", "PyPI Upload Token", r"pypi-AgEIcHlwaS5vcmc[\w-]{50,1000}",
       needle="pypi-"),
    _r("digitalocean-pat", "DigitalOcean PAT", r"dop_v1_[a-f0-9]{64}", needle="dop_v1_"),
    _r("alibaba-cloud-access-key", "Alibaba Cloud Access Key", r"\bLTAI[a-zA-Z0-9]{12,20}\b",
       needle="ltai"),
    _r("age-secret-key", "Age Secret Key", r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}",
       needle="age-secret-key-1"),
    _r("jwt", "JSON Web Token",
       r"\beyJ[A-Za-z0-9_-]{10,4096}+\.eyJ[A-Za-z0-9_-]{10,8192}+\.[A-Za-z0-9_-]{10,4096}+",
       check=_jwt_check, needle="eyj"),
    _r("url-credentials", "Credentials in a URL (ours)",
       r"\b[a-zA-Z][a-zA-Z0-9+.-]{1,20}+://[^\s:/@'\"<>]{1,128}+:([^\s/@'\"<>]{1,256}+)@"
       r"[A-Za-z0-9\[]", group=1, check=_url_check, needle="://"),
    _r("bearer-token", "Bearer Token (ours)",
       r"\bBearer[ \t]{1,4}([A-Za-z0-9._~+/-]{20,2048}+={0,2})", _AI, group=1,
       check=lambda m: entropy(m.group(1)) >= 3.0 and not is_placeholder(m.group(1)),
       needle="bearer"),
    # key = value (also "key": "value", key: value, KEY="value"); the check decides
    _r("generic-api-key", "Generic secret assignment",
       r"(?<![\w.-])([A-Za-z_][\w.-]{0,63}+)[\"']?[ \t]{0,4}(?::=|=>|[:=])[ \t]{0,4}"
       r"([\"'`]?)([^\s\"'`,;]{1,512}+)", group=3, check=_generic_check),
)
