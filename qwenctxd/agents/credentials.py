"""The credential-path rule: which files no background agent may read, wherever they are.

A path is a credential path when any of the rules below matches **the path as spelled** or
**where it really lands** (:func:`~qwenctxd.fsutil.real_location`: ``..`` folded, symlinks
followed), so a link inside the project pointing at ``~/.aws/credentials`` is one too. The
rules are judged on path components, not on the home directory alone: a copy of ``.ssh/`` in
a project, or a home that is not ``$HOME``, is covered the same way.

Directories whose whole contents are credentials (any component)::

    .ssh  .aws  .gnupg  .azure  .kube  .password-store  .docker (config.json only)
    .config/gcloud  .config/gh  .config/hub  .terraform.d  .gem (credentials only)

File names::

    .env  .env.*  *.env  .envrc          (but .env.example / .env.sample / .env.template /
                                          .env.dist: committed templates, allowed)
    id_rsa id_dsa id_ecdsa id_ed25519 id_ecdsa_sk id_ed25519_sk id_xmss (any suffix but .pub)
    id_<name> without an extension (a custom ssh identity; id_rsa.pub-style public keys pass)
    *.pem *.key *.p12 *.pfx *.p8 *.pkcs12 *.jks *.keystore *.kdbx *.ppk *.ovpn *.tfstate
    .netrc _netrc .npmrc .pypirc .git-credentials .pgpass .my.cnf .s3cfg .boto .dockercfg
    .htpasswd .vault-token .terraformrc .bash_history .zsh_history .psql_history
    .mysql_history .python_history .node_repl_history
    credentials  credentials.*  secrets.{json,ya?ml,toml,ini,env,txt}  client_secret*.json
    *service-account*.json  *service_account*.json  application_default_credentials.json
    oauth_creds.json (Qwen Code's OAuth tokens)  accessTokens.json  azureProfile.json

Where the rules come from: the filename signatures of gitrob (michenriksen/gitrob, carried on
by shhgit) — files that "typically contain sensitive information" — trimmed to those that hold
secrets rather than merely configuration, plus ssh(1)'s default ``IdentityFile`` names and the
documented credential locations of the AWS, Google Cloud, Azure, Kubernetes, Docker, GitHub
and Terraform CLIs. ``.env`` templates are allowed because they are committed, documented
placeholders that agents need to understand a project's configuration; what an agent writes
into memory is scanned for secrets anyway. File *names* are not secret: listings and globs
show them; reading, grepping and the read-only shell refuse their contents.
"""

from __future__ import annotations

import os
import re

from qwenctxd.fsutil import real_location

__all__ = ["credential_reason", "is_credential_path"]

_SECRET_DIRS = frozenset({".ssh", ".aws", ".gnupg", ".azure", ".kube", ".password-store",
                          ".terraform.d"})
_SECRET_CONFIG_DIRS = frozenset({"gcloud", "gh", "hub"})  # under a .config directory
_IN_DIR = {".docker": frozenset({"config.json"}), ".gem": frozenset({"credentials"})}
_ENV_TEMPLATES = frozenset({"example", "sample", "template", "dist", "defaults"})
_NAMES = frozenset({
    ".netrc", "_netrc", ".npmrc", ".pypirc", ".git-credentials", ".pgpass", ".my.cnf",
    ".s3cfg", ".boto", ".dockercfg", ".htpasswd", ".vault-token", ".terraformrc", ".envrc",
    ".bash_history", ".zsh_history", ".psql_history", ".mysql_history", ".python_history",
    ".node_repl_history", "application_default_credentials.json", "oauth_creds.json",
    "accesstokens.json", "azureprofile.json", "credentials",
})
_EXTENSIONS = frozenset({".pem", ".key", ".p12", ".pfx", ".p8", ".pkcs12", ".jks", ".keystore",
                         ".kdbx", ".ppk", ".ovpn", ".tfstate", ".env"})
_SSH_KEY = re.compile(r"id_(rsa|dsa|ecdsa|ed25519|ecdsa_sk|ed25519_sk|xmss)\b.*")
_CUSTOM_ID = re.compile(r"id_[a-z0-9_-]+")  # no dot: a custom identity file name
_DATA_EXT = r"(json|ya?ml|toml|ini|env|txt|xml|cfg|conf)"
_SECRET_FILE = re.compile(rf"(credentials?|secrets?)\.{_DATA_EXT}|client_secrets?.*\.json"
                          r"|.*service[-_]?account.*\.json")


def _name_reason(name: str) -> str | None:
    low = name.lower()
    if low == ".env" or (low.startswith(".env.") and low[5:] not in _ENV_TEMPLATES):
        return "an environment file (.env)"
    if low in _NAMES:
        return f"a credential file ({name})"
    ext = os.path.splitext(low)[1]
    if ext in _EXTENSIONS:
        return f"a key or credential file (*{ext})"
    if low.endswith(".pub"):
        return None
    if _SSH_KEY.fullmatch(low) or _CUSTOM_ID.fullmatch(low):
        return f"an ssh private key ({name})"
    if _SECRET_FILE.fullmatch(low):
        return f"a credential file ({name})"
    return None


def _parts_reason(parts: list[str]) -> str | None:
    for i, part in enumerate(parts):
        if part in _SECRET_DIRS:
            return f"inside {part}/, a credential directory"
        if part == ".config" and i + 1 < len(parts) and parts[i + 1] in _SECRET_CONFIG_DIRS:
            return f"inside .config/{parts[i + 1]}/, a credential directory"
        if part in _IN_DIR and i + 1 < len(parts) and parts[i + 1] in _IN_DIR[part]:
            return f"{part}/{parts[i + 1]}, a credential file"
    return _name_reason(parts[-1]) if parts else None


def credential_reason(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` (absolute, or relative to the current directory) is a credential path —
    spelled or really — or None when it is not."""
    spelled = os.path.normpath(os.path.abspath(os.fspath(path)))
    for candidate in (spelled, real_location(spelled)):
        reason = _parts_reason([p for p in candidate.split(os.sep) if p])
        if reason is not None:
            return reason
    return None


def is_credential_path(path: str | os.PathLike[str]) -> bool:
    return credential_reason(path) is not None
