"""The one secret scanner (qwenctxd.secrets): a table of secret formats and harmless
look-alikes, redaction spans in the original text, obfuscations (hypothesis), linear time.

Every fake token is assembled at runtime (prefix + generated body) so no literal in this file
looks like a provider token."""

from __future__ import annotations

import base64
import hashlib
import struct
import time
import uuid
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qwenctxd.secrets import redact, scan
from qwenctxd.secrets.rules import RULES

ALNUM = "aB3dE5gH7jK9mN1pQ2sT4vW6yZ8cF0rU"
HEX = "0123456789abcdef"
B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


def cyc(alphabet: str, n: int, shift: int = 0) -> str:
    a = alphabet[shift % len(alphabet):] + alphabet[: shift % len(alphabet)]
    return (a * (n // len(a) + 1))[:n]


AKIA = "AK" + "IA" + cyc(B32[9:], 16)
AWS_SECRET = cyc("wJalrXUtnFEMIK7MDENGbPxRfiCY" + "0123456789/+", 40, 3)
GHP = "gh" + "p_" + cyc(ALNUM, 36)
PEM_BODY = "\n".join(cyc("MIIEvQIBADANBgkqhkiG9w0BAQEFAASC", 64, i) for i in range(4))
JWT = ("ey" + "J" + base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').decode().rstrip("=")[3:]
       + ".ey" + "J" + base64.urlsafe_b64encode(b'{"sub":"1234567890","name":"x"}').decode()
       .rstrip("=")[3:] + "." + cyc(ALNUM + "-_", 43))

# (rule id expected, text, the secret part that must be gone after redaction)
SECRETS: list[tuple[str, str, str]] = [
    ("aws-access-token", f"key id {AKIA} here", AKIA),
    ("aws-access-token", "ASIA" + cyc(B32, 16), "ASIA" + cyc(B32, 16)),
    ("aws-secret-access-key", f"aws_secret_access_key = {AWS_SECRET}", AWS_SECRET),
    ("aws-secret-access-key", f"[default]\nid={AKIA}\nkey={AWS_SECRET}\n", AWS_SECRET),
    ("aws-secret-access-key", f'AWS_SECRET_ACCESS_KEY="{AWS_SECRET}"', AWS_SECRET),
    ("github-pat", f"token {GHP}", GHP),
    ("github-oauth", "gh" + "o_" + cyc(ALNUM, 36, 1), "gh" + "o_" + cyc(ALNUM, 36, 1)),
    ("github-app-token", "gh" + "s_" + cyc(ALNUM, 36, 2), "gh" + "s_" + cyc(ALNUM, 36, 2)),
    ("github-app-token", "gh" + "u_" + cyc(ALNUM, 36, 3), "gh" + "u_" + cyc(ALNUM, 36, 3)),
    ("github-refresh-token", "gh" + "r_" + cyc(ALNUM, 36, 4), "gh" + "r_" + cyc(ALNUM, 36, 4)),
    ("github-fine-grained-pat", "github_" + "pat_" + cyc(ALNUM + "_", 82),
     "github_" + "pat_" + cyc(ALNUM + "_", 82)),
    ("gitlab-pat", "glpat" + "-" + cyc(ALNUM, 20), "glpat" + "-" + cyc(ALNUM, 20)),
    ("gitlab-ptt", "glptt" + "-" + cyc(HEX, 40), "glptt" + "-" + cyc(HEX, 40)),
    ("gitlab-rrt", "GR1348941" + cyc(ALNUM, 20), "GR1348941" + cyc(ALNUM, 20)),
    ("slack-bot-token", "xox" + "b-1234567890123-9876543210-" + cyc(ALNUM, 24),
     "xox" + "b-1234567890123-9876543210-" + cyc(ALNUM, 24)),
    ("slack-user-token", "xox" + "p-1234567890-1234567890-1234567890-" + cyc(HEX, 32),
     "xox" + "p-1234567890-1234567890-1234567890-" + cyc(HEX, 32)),
    ("slack-app-token", "xap" + "p-1-A0B1C2D3E4F-1234567890123-" + cyc(HEX, 64),
     "xap" + "p-1-A0B1C2D3E4F-1234567890123-" + cyc(HEX, 64)),
    ("slack-webhook-url", "https://hooks.slack" + ".com/services/T0000AAAA/B0000BBBB/"
     + cyc(ALNUM, 24), "/B0000BBBB/" + cyc(ALNUM, 24)),
    ("stripe-access-token", "sk" + "_live_" + cyc(ALNUM, 24), "sk" + "_live_" + cyc(ALNUM, 24)),
    ("stripe-access-token", "rk" + "_test_" + cyc(ALNUM, 24), "rk" + "_test_" + cyc(ALNUM, 24)),
    ("gcp-api-key", "AI" + "za" + cyc(ALNUM + "_-", 35), "AI" + "za" + cyc(ALNUM + "_-", 35)),
    ("gcp-oauth-client-secret", "GOC" + "SPX-" + cyc(ALNUM, 28), "GOC" + "SPX-" + cyc(ALNUM, 28)),
    ("private-key", '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\n'
     + PEM_BODY.replace("\n", "\\n") + '\\n-----END PRIVATE KEY-----\\n"}', PEM_BODY[:40]),
    ("private-key", "-----BEGIN RSA PRIVATE KEY-----\n" + PEM_BODY + "\n-----END RSA PRIVATE KEY-----",
     PEM_BODY[:40]),
    ("private-key", "-----BEGIN OPENSSH PRIVATE KEY-----\n" + PEM_BODY, PEM_BODY[-40:]),
    ("azure-storage-account-key", "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey="
     + cyc(ALNUM + "+/", 86) + "==;EndpointSuffix=core.windows.net", cyc(ALNUM + "+/", 86)),
    ("azure-connection-string", "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName="
     "Root;SharedAccessKey=" + cyc(ALNUM + "+/", 43) + "=", cyc(ALNUM + "+/", 43)),
    ("sendgrid-api-token", "S" + "G." + cyc(ALNUM, 22) + "." + cyc(ALNUM, 43, 5),
     cyc(ALNUM, 43, 5)),
    ("twilio-api-key", "S" + "K" + cyc(HEX, 32, 3), "S" + "K" + cyc(HEX, 32, 3)),
    ("telegram-bot-api-token", "bot 123456789:" + "A" + cyc(ALNUM + "_-", 34),
     "A" + cyc(ALNUM + "_-", 34)),
    ("shopify-access-token", "shp" + "at_" + cyc(HEX, 32), "shp" + "at_" + cyc(HEX, 32)),
    ("shopify-custom-access-token", "shp" + "ca_" + cyc(HEX, 32), "shp" + "ca_" + cyc(HEX, 32)),
    ("shopify-private-app-access-token", "shp" + "pa_" + cyc(HEX, 32),
     "shp" + "pa_" + cyc(HEX, 32)),
    ("shopify-shared-secret", "shp" + "ss_" + cyc(HEX, 32), "shp" + "ss_" + cyc(HEX, 32)),
    ("openai-api-key", "OPENAI_API_KEY=" + "sk" + "-proj-" + cyc(ALNUM + "_-", 60),
     cyc(ALNUM + "_-", 60)),
    ("openai-api-key", "sk" + "-" + cyc(ALNUM, 20) + "T3Blbk" + "FJ" + cyc(ALNUM, 20),
     "T3Blbk" + "FJ" + cyc(ALNUM, 20)),
    ("anthropic-api-key", "sk" + "-ant-api03-" + cyc(ALNUM + "_-", 90), cyc(ALNUM + "_-", 90)),
    ("huggingface-access-token", "h" + "f_" + cyc(ALNUM, 34), "h" + "f_" + cyc(ALNUM, 34)),
    ("huggingface-organization-api-token", "api" + "_org_" + cyc(ALNUM, 34), cyc(ALNUM, 34)),
    ("npm-access-token", "//registry.npmjs.org/:_authToken=" + "np" + "m_" + cyc(ALNUM, 36),
     cyc(ALNUM, 36)),
    ("pypi-upload-token", "pypi" + "-AgEIcHlwaS5vcmc" + cyc(ALNUM, 60), cyc(ALNUM, 60)),
    ("digitalocean-pat", "dop" + "_v1_" + cyc(HEX, 64), cyc(HEX, 64)),
    ("alibaba-cloud-access-key", "LT" + "AI" + cyc(ALNUM, 16), "LT" + "AI" + cyc(ALNUM, 16)),
    ("jwt", f"Authorization: {JWT}", JWT),
    ("bearer-token", "Authorization: Bearer " + cyc(ALNUM + ".-_", 40), cyc(ALNUM + ".-_", 40)),
    ("url-credentials", "DATABASE_URL=postgres://app:" + "s3cr3t-Pw9" + "@db.internal:5432/app",
     "s3cr3t-Pw9"),
    ("url-credentials", "git clone https://bob:" + "Zx8-qq71" + "@git.example.com/x.git",
     "Zx8-qq71"),
    ("url-credentials", "amqp://guest:" + "Rb7x!kQ2" + "@mq:5672", "Rb7x!kQ2"),
    ("generic-password", "DB_PASSWORD=" + "hunter22x", "hunter22x"),
    ("generic-password", 'password: "' + "c0rrect-h0rse" + '"', "c0rrect-h0rse"),
    ("generic-password", "passwd = " + "Tr0ub4dor&3", "Tr0ub4dor&3"),
    ("generic-api-key", "client_secret: " + "kd93Jd-2kdn38", "kd93Jd-2kdn38"),
    ("generic-api-key", "api_key = " + cyc(ALNUM, 32, 7), cyc(ALNUM, 32, 7)),
    ("generic-api-key", '"apiKey": "' + cyc(ALNUM, 24, 9) + '"', cyc(ALNUM, 24, 9)),
    ("generic-api-key", "AUTH_TOKEN=" + cyc(HEX + "XYZ", 40, 2), cyc(HEX + "XYZ", 40, 2)),
    ("generic-api-key", "access-key: " + cyc(ALNUM, 20, 11), cyc(ALNUM, 20, 11)),
    ("age-secret-key", "AGE-SECRET" + "-KEY-1" + cyc("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L", 58),
     cyc("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L", 58)),
]


def _png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    raw = b"".join(b"\x00" + bytes((x * 7 + y * 13) % 256 for x in range(48)) for y in range(16))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 16, 16, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


HARMLESS: list[str] = [
    str(uuid.UUID(int=0x123E4567E89B12D3A456426614174000)),
    "request id 3f2504e0-4f89-11d3-9a0c-0305e82c3301 failed",
    "commit " + hashlib.sha1(b"x").hexdigest(),
    "merged in " + hashlib.sha1(b"y").hexdigest()[:12],
    "sha256: " + hashlib.sha256(b"z").hexdigest(),
    "digest sha256:" + hashlib.sha256(b"image").hexdigest(),
    '"integrity": "sha512-' + base64.b64encode(hashlib.sha512(b"pkg").digest()).decode() + '"',
    "resolved sha1-" + base64.b64encode(hashlib.sha1(b"a").digest()).decode(),
    "![logo](data:image/png;base64," + base64.b64encode(_png()).decode() + ")",
    "Reset your password in settings; the password must be at least 12 characters.",
    "password: ${PASSWORD}",
    'token = "<your-token>"',
    "api_key: os.environ['OPENAI_API_KEY']",
    "DB_PASSWORD=$DB_PASSWORD",
    "password: required",
    "secret: ********",
    "max_tokens: 4096",
    "tokenizer: cl100k_base",
    "author: Jane Doe",
    "auth: true",
    "The API key lives in the vault; ask ops for access.",
    "postgres://localhost:5432/app",
    "https://user@example.com/repo.git",
    "see https://example.com/a:b@c" [:0] + "ratio 16:9 and time 12:30:45",
    "AKIA is the prefix of AWS access key ids",
    "-----BEGIN PUBLIC KEY-----\n" + PEM_BODY + "\n-----END PUBLIC KEY-----",
    "-----BEGIN CERTIFICATE-----\n" + PEM_BODY + "\n-----END CERTIFICATE-----",
    "[redacted: github-pat] and token: [redacted: generic-api-key]",
]


def test_the_table_is_big_enough() -> None:
    assert len(SECRETS) >= 40 and len(HARMLESS) >= 15
    assert {rule for rule, _, _ in SECRETS} >= {r.id for r in RULES} - {"generic-api-key"} | {
        "generic-api-key"}


@pytest.mark.parametrize(("rule", "text", "secret"), SECRETS,
                         ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(SECRETS)])
def test_secret_is_found_and_redacted(rule: str, text: str, secret: str) -> None:
    findings = scan(text)
    assert rule in {r for f in findings for r in f.rules}, findings
    out = redact(text)
    assert secret not in out.text
    assert f"[redacted: {rule}]" in out.text or any(rule in f.rules for f in out.findings)
    assert scan(out.text) == []  # redaction is idempotent


@pytest.mark.parametrize("text", HARMLESS, ids=[f"harmless-{i}" for i in range(len(HARMLESS))])
def test_harmless_lookalike_is_left_alone(text: str) -> None:
    assert scan(text) == []
    assert redact(text).text == text


def test_spans_are_in_the_original_text() -> None:
    zw = GHP[:9] + "\u200b" + GHP[9:]
    text = "before " + zw + " after"
    (f,) = scan(text)
    assert text[f.start:f.end] == zw
    assert redact(text).text == "before [redacted: github-pat] after"
    url = "x postgres://u:" + "pw12345678" + "@h/db y"
    (g,) = scan(url)
    assert url[g.start:g.end] == "pw12345678"


def test_counts_per_rule() -> None:
    text = f"{GHP}\n{GHP}\n{AKIA}"
    assert redact(text).counts == {"github-pat": 2, "aws-access-token": 1}
    assert redact(text).summary() == [{"rule": "github-pat", "count": 2},
                                      {"rule": "aws-access-token", "count": 1}]


# -- obfuscations -------------------------------------------------------------------------------

KEYS = [GHP, AKIA, "sk" + "_live_" + cyc(ALNUM, 24), "AI" + "za" + cyc(ALNUM + "_-", 35),
        "glpat" + "-" + cyc(ALNUM, 20)]


def zero_width(key: str, k: int) -> str:
    i = 2 + k % (len(key) - 3)
    return key[:i] + "\u200b\u2060"[k % 2] + key[i:] + ("\u00ad" if k % 3 == 0 else "")


def split_lines(key: str, k: int) -> str:
    i = 4 + k % (len(key) - 6)
    return key[:i] + "\n" + " " * (k % 5) + key[i:]


def b64(key: str, k: int) -> str:
    return base64.b64encode(f"the key is {key} ok".encode()).decode()


def escaped(key: str, k: int) -> str:
    return "".join((f"\\u{ord(c):04x}" if (i + k) % 2 else f"\\x{ord(c):02x}") for i, c in
                   enumerate(key))


def fullwidth(key: str, k: int) -> str:
    return "".join(chr(ord(c) + 0xFEE0) if c.isalnum() and (i + k) % 3 else c
                   for i, c in enumerate(key))


OBFUSCATIONS = [zero_width, split_lines, b64, escaped, fullwidth]
noise = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)
words = st.lists(st.sampled_from(["the", "deploy", "key", "note:", "see", "\n", "x=1", "é", "中文",
                                  "  ", "token", "=", "-", "_"]), max_size=12).map(" ".join)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(noise, words), st.sampled_from(KEYS), st.sampled_from(OBFUSCATIONS),
       st.integers(0, 1000), st.one_of(noise, words))
def test_obfuscated_key_in_random_text_is_always_redacted(before: str, key: str, how, k: int,
                                                          after: str) -> None:
    hidden = how(key, k)
    text = f"{before} {hidden} {after}"
    out = redact(text)
    assert out.findings, (how.__name__, text)
    assert hidden not in out.text
    assert key not in out.text
    # nor its decoded form: nothing left in the output still scans as that key
    assert key not in "".join(ch for ch in out.text if ch not in "\u200b\u2060\u00ad\n ")


# -- linear time ------------------------------------------------------------------------------


def _text(kib: int) -> str:
    unit = ("Deploy notes: run make, then " + hashlib.sha256(b"u").hexdigest()
            + " password: required. token = <your-token> 3f2504e0-4f89-11d3-9a0c-0305e82c3301\n")
    return (unit * (kib * 1024 // len(unit) + 1))[: kib * 1024]


def test_scan_time_grows_linearly() -> None:
    def cost(kib: int) -> float:
        text = _text(kib)
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            scan(text)
            best = min(best, time.perf_counter() - t)
        return best / kib

    small, large = cost(16), cost(256)
    assert large < small * 3, (small, large)


@pytest.mark.parametrize("text", [
    "a" * (1 << 20), "-" * (1 << 20), "=" * (1 << 20), "\\u00" * (1 << 18),
    ("password=" + "x" * 600 + " ") * 1500, ("A" * 8000 + "\n") * 130, "eyJ" * 350_000,
    ("https://" + "u" * 100 + ":") * 8000, "\u200b" * (1 << 18) + "x",
], ids=["a", "dash", "eq", "esc", "assign", "b64lines", "eyJ", "url", "zw"])
def test_adversarial_inputs_stay_fast(text: str) -> None:
    t = time.perf_counter()
    scan(text)
    assert time.perf_counter() - t < 3.0
