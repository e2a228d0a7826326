"""Agent reads confined (issue 23): the credential-path rule, the read scope, the agent tools
over both filesystems, and the read-only shell's path judge — many attacker spellings, and the
harmless commands that must keep working. Real files in tmp dirs."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from qwenctxd.agents.audit import AuditLog
from qwenctxd.agents.credentials import credential_reason
from qwenctxd.agents.overlay import OverlayFS
from qwenctxd.agents.permissions import MemoryWriteScope, ReadScope
from qwenctxd.agents.shell_paths import shell_read_refusal
from qwenctxd.agents.shell_readonly import classify
from qwenctxd.agents.tools import ToolContext, call_tool

AWS_ID, AWS_SECRET = "AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
ENV_SECRET, SSH_SECRET = "hunter2-env-secret", "b3BlbnNzaC1rZXktdjEAAAAAssh-secret"
SECRETS = (AWS_ID, AWS_SECRET, ENV_SECRET, SSH_SECRET)

CREDENTIAL_PATHS = [
    "/h/.env", "/p/.env.local", "/p/.env.production", "/p/config/prod.env", "/p/.envrc",
    "/h/.ssh/config", "/h/.ssh/known_hosts", "/h/.aws/credentials", "/h/.aws/config",
    "/h/.config/gcloud/application_default_credentials.json", "/h/.azure/accessTokens.json",
    "/h/.kube/config", "/h/.docker/config.json", "/h/.gnupg/private-keys-v1.d/x.key",
    "/p/server.pem", "/p/tls/server.key", "/p/cert.p12", "/p/cert.pfx", "/p/AuthKey_X.p8",
    "/p/id_rsa", "/p/id_ed25519", "/p/id_ecdsa_sk", "/p/keys/id_rsa.old", "/p/id_deploy",
    "/h/.netrc", "/h/_netrc", "/h/.npmrc", "/h/.pypirc", "/h/.git-credentials", "/h/.pgpass",
    "/h/.my.cnf", "/h/.s3cfg", "/h/.dockercfg", "/p/credentials.json", "/p/credentials",
    "/p/secrets.yaml", "/p/client_secret_123.apps.json", "/p/my-service-account.json",
    "/h/.qwen/oauth_creds.json", "/h/.bash_history", "/p/terraform.tfstate",
    "/h/.config/gh/hosts.yml", "/h/.password-store/x.gpg", "/p/app.keystore", "/p/db.kdbx",
]
HARMLESS_PATHS = [
    "/p/.env.example", "/p/.env.sample", "/p/.env.template", "/p/README.md", "/p/src/env.py",
    "/p/src/environment.ts", "/p/id_rsa.pub", "/p/.ssh_notes.md", "/p/src/identity.py",
    "/p/id_map.json", "/p/keyboard.py", "/p/docs/credentials.md", "/p/secrets.py",
    "/p/src/keys.py", "/p/.gitignore", "/p/package.json", "/p/.github/workflows/ci.yml",
]


@pytest.mark.parametrize("path", CREDENTIAL_PATHS)
def test_credential_paths_are_refused(path: str) -> None:
    assert credential_reason(path) is not None


@pytest.mark.parametrize("path", HARMLESS_PATHS)
def test_harmless_paths_pass(path: str) -> None:
    assert credential_reason(path) is None


# -- a project with secrets in and around it ----------------------------------------------------
@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    home, proj, outside = tmp_path / "home", tmp_path / "home" / "proj", tmp_path / "outside"
    (home / ".aws").mkdir(parents=True)
    (home / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = {AWS_ID}\naws_secret_access_key = {AWS_SECRET}\n")
    (proj / "src").mkdir(parents=True)
    (proj / ".git").mkdir()
    outside.mkdir()
    (outside / "notes.txt").write_text(f"outside {ENV_SECRET}\n")
    (proj / ".env").write_text(f"DB_PASSWORD={ENV_SECRET}\n")
    (proj / ".env.example").write_text("DB_PASSWORD=changeme\n")
    (proj / "id_rsa").write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{SSH_SECRET}\n")
    (proj / "README.md").write_text("# demo\nTODO: docs\n")
    (proj / "src" / "app.py").write_text("# TODO: more\nprint('hi')\n")
    os.symlink(home / ".aws" / "credentials", proj / "creds")
    os.symlink(home / ".aws", proj / "awsdir")
    os.symlink(outside, proj / "out")
    os.symlink(outside / "notes.txt", proj / "src" / "notes_link.txt")
    return {"home": home, "proj": proj, "outside": outside, "base": tmp_path}


def _env(world: dict[str, Path]) -> dict[str, str]:
    return {"HOME": str(world["home"]), "PATH": "/usr/bin:/bin", "USER": "agent",
            "LANG": "C.UTF-8"}


def test_read_scope(world: dict[str, Path]) -> None:
    proj, home = world["proj"], world["home"]
    scope = ReadScope.of(proj)
    assert scope.allows(proj / "README.md") and scope.allows(proj / ".env.example")
    assert scope.allows(proj / "src" / "new_file.py")  # not there yet: still inside
    for p in (proj / ".env", proj / "id_rsa", proj / "creds", proj / "awsdir" / "config",
              proj / "out" / "notes.txt", proj / "src" / "notes_link.txt",
              proj / ".." / ".aws" / "credentials", home / ".aws" / "credentials",
              Path("/etc/passwd")):
        why = scope.refusal(p)
        assert why is not None and why.startswith("read refused:"), p


SHELL_REFUSED = [
    "cat ~/.aws/credentials", "cat $HOME/.aws/credentials", "cat ${HOME}/.aws/credentials",
    'cat "$HOME/.aws/credentials"', "cat '$HOME'/../home/.aws/credentials",
    "head -n 3 ~/.aws/credentials", "tail -1 ~/.aws/credentials", "cat ~/.aws/*",
    "cat ~/.a*/cred*", "cat /root/.a*/cred*", "cat ../.aws/credentials",
    "cat src/../../.aws/credentials", "cat creds", "cat awsdir/credentials", "cat out/notes.txt",
    "cat src/notes_link.txt", "head .env", "cat .env", "cat '.env'", 'cat ".env"', "cat \\.env",
    "cat .e*", "cat .[e]nv", "cat {README.md,.env}", "cat id_rsa", "cat id_*", "cat *",
    "grep -r AKIA ~", "grep -r AKIA $HOME", "grep -r AKIA .", "grep -rn PASSWORD", "rg AKIA",
    "grep -R hunter2 src out", "grep -R TODO src", "grep AKIA ~/.aws/credentials", "cat < .env",
    "cat < ~/.aws/credentials", "wc -c < id_rsa", "find . -name id_rsa | xargs cat",
    "xargs cat < README.md", "cat $(echo .env)", "cat `echo .env`", "echo $(cat .env)",
    "bash -c 'cat ~/.aws/credentials'", "sh -c \"head .env\"", "env cat .env",
    "timeout 5 cat id_rsa", "git show HEAD:.env", "git grep AKIA",
    "sed -n 1p .env", "sed '1r /etc/passwd' README.md", "sed 1r.env README.md",
    "awk '{getline l < \"/etc/passwd\"; print l}' README.md", "awk 1 .env",
    'awk "BEGIN{getline l < \\"$HOME/notes\\"; print l}"', "jq . ~/.docker/config.json",
    "cat <<EOF\n$(cat .env)\nEOF", 'cat <<< "$(head id_rsa)"', "cat ~+/.env", 'cat "$PWD/.env"',
    "cat /proc/self/cwd/.env", "git log -p -- .env", "cat .en?", "od -c id_rsa",
    "grep -f/etc/passwd README.md", "grep --file=/etc/passwd README.md", "cat /etc/passwd",
    "ls ~/.ssh", "ls /", "diff -r src out", "for f in *; do cat $f; done", "cat ~root/.bashrc",
    "jq -n 'import \"x\" as $x; $x'", "cat /proc/self/environ", "stat .env",
    "cat README.md; cat .env", "cat README.md && head id_rsa", "cat README.md | head ~/.netrc",
]
SHELL_ALLOWED = [
    "git log --oneline", "git status", "git diff", "grep -r TODO src/", "grep -rn TODO src",
    "cat README.md", "ls", "ls -la src", "head -n 2 README.md src/app.py", "wc -l src/*.py",
    "cat .env.example", "find . -name '*.py'", "cat README.md 2>/dev/null", "echo ~/.aws",
    "pwd", "grep TODO README.md | head -1", "cat src/app.py | wc -l", "ls -la",
    "test -f .env && echo yes", "sort README.md", "tree src", "du -sh src",
    "awk '{print $1}' README.md", "jq -n 1", "sed -n 1p README.md", "git show HEAD:README.md",
]


def _judge(world: dict[str, Path], command: str) -> str | None:
    verdict = classify(command)
    if not verdict.read_only:
        return f"classifier: {verdict.reason}"
    return shell_read_refusal(command, world["proj"], ReadScope.of(world["proj"]), _env(world))


@pytest.mark.parametrize("command", SHELL_REFUSED)
def test_shell_refuses_reads_of_secrets_and_outside(world: dict[str, Path], command: str
                                                     ) -> None:
    assert _judge(world, command) is not None, command


@pytest.mark.parametrize("command", SHELL_ALLOWED)
def test_harmless_shell_commands_still_run(world: dict[str, Path], command: str) -> None:
    assert _judge(world, command) is None, command


# -- the tools, over the real tree and over an overlay ------------------------------------------
ATTACKS = [
    ("read_file", {"file_path": "{home}/.aws/credentials"}),
    ("read_file", {"file_path": "../.aws/credentials"}),
    ("read_file", {"file_path": ".env"}),
    ("read_file", {"file_path": "id_rsa"}),
    ("read_file", {"file_path": "creds"}),
    ("read_file", {"file_path": "awsdir/credentials"}),
    ("read_file", {"file_path": "out/notes.txt"}),
    ("read_file", {"file_path": "src/notes_link.txt"}),
    ("list_directory", {"path": "{home}/.aws"}),
    ("list_directory", {"path": "awsdir"}),
    ("glob", {"pattern": "*", "path": "{home}/.aws"}),
    ("grep_search", {"pattern": "AKIA", "path": "{home}"}),
    ("grep_search", {"pattern": "AKIA", "path": "awsdir"}),
    ("edit", {"file_path": ".env", "old_string": "DB", "new_string": "X"}),
    ("run_shell_command", {"command": "cat ~/.aws/credentials"}),
    ("run_shell_command", {"command": "cat $HOME/.aws/credentials"}),
    ("run_shell_command", {"command": "head -3 .env"}),
    ("run_shell_command", {"command": "grep -r AKIA ."}),
    ("run_shell_command", {"command": "cat creds"}),
]


def _fill(args: dict[str, object], home: Path) -> dict[str, object]:
    return {k: v.format(home=home) if isinstance(v, str) else v for k, v in args.items()}


async def _run(ctx: ToolContext, calls: list[tuple[str, dict[str, object]]]) -> list[str]:
    with anyio.fail_after(60):
        return [await call_tool(ctx, name, args) for name, args in calls]


@pytest.mark.parametrize("kind", ["real", "overlay"])
def test_tools_refuse_every_attack_and_leak_nothing(world: dict[str, Path], kind: str) -> None:
    proj, home = world["proj"], world["home"]
    state = world["base"] / "state"
    if kind == "real":
        ctx = ToolContext.real_tree(proj, MemoryWriteScope(writable_roots=[proj / "mem"]),
                                    AuditLog(state / "audit"), agent="t")
    else:
        ctx = ToolContext.over_overlay(proj, OverlayFS(proj, state / "ov"))
    calls = [(n, _fill(a, home)) for n, a in ATTACKS]
    results = anyio.run(_run, ctx, calls)
    for (name, args), result in zip(calls, results, strict=True):
        assert result.startswith("Error:") and "refused" in result, (name, args, result)
        assert not any(s in result for s in SECRETS), (name, args, result)
    # a grep over the whole project finds the harmless matches and skips the credentials
    found = anyio.run(_run, ctx, [("grep_search", {"pattern": "TODO|AKIA|hunter2|ssh-secret|"
                                                   "outside"})])[0]
    assert "README.md:2: TODO: docs" in found and "app.py:1: # TODO: more" in found
    assert not any(s in found for s in SECRETS) and "not searched" in found
    listing = anyio.run(_run, ctx, [("list_directory", {"path": str(proj)}),
                                    ("glob", {"pattern": ".env*"}),
                                    ("read_file", {"file_path": ".env.example"}),
                                    ("run_shell_command", {"command": "grep -r TODO src/"})])
    assert ".env" in listing[0].split("\n") and "id_rsa" in listing[0].split("\n")  # names
    assert str(proj / ".env") in listing[1]
    assert listing[2] == "DB_PASSWORD=changeme"
    assert listing[3].startswith("[exit 0]") and "TODO: more" in listing[3]
