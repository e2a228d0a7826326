"""``qwenctl mcp``: qwenctxd's memory, skills and instructions as a stdio MCP server.

Built on the official ``mcp`` SDK's ``MCPServer`` (tools with pydantic-validated arguments, so a
bad argument gets the SDK's own validation error) and a thin client of the daemon
(:class:`qwenctl.mcp_link.DaemonLink`). The project is ``--cwd``, else the first root the MCP
client announces (``roots/list``), else the process cwd; it is looked up per request, so a
client that changes its roots is followed.

Tools: ``recall_memory``, ``save_memory``, ``forget_memory``, ``list_skills``, ``load_skill``,
``project_instructions``, ``search_sessions``. Resources: ``qwenctx://instructions`` and one per
memory document
(``qwenctx://memory/<scope>/<topic>/<file>``). Prompts: one per skill, named after it. The
resource and prompt lists come from the daemon on every list request.
"""

import argparse
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Literal

from qwenctxd.protocol import instructions as iwire
from qwenctxd.protocol import memory as mwire
from qwenctxd.protocol import methods
from qwenctxd.protocol import skills as kwire
from qwenctxd.protocol.methods import Method

if TYPE_CHECKING:
    from qwenctl.mcp_link import DaemonLink

SERVER_NAME = "qwenctx"
INSTRUCTIONS_URI = "qwenctx://instructions"
MEMORY_URI_PREFIX = "qwenctx://memory/"
ROOTS_TIMEOUT_S = 5.0
SERVER_INSTRUCTIONS = (
    "qwenctx keeps the user's long-lived memory (shared by every agent they use), their skills "
    "and the project's instructions. Call recall_memory before work that may depend on earlier "
    "decisions or preferences; save_memory when the user states a lasting preference, a "
    "correction, a project fact or a pointer worth keeping; forget_memory when asked to forget."
)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("mcp", parents=[common],
                       help="serve memory, skills and instructions over MCP (stdio)")
    p.add_argument("--cwd", dest="mcp_cwd", default=None,
                   help="project directory (default: the client's first root, else the cwd)")


def cmd_mcp(ctx: Any) -> int:
    args = ctx.args
    cwd = os.path.abspath(args.mcp_cwd) if args.mcp_cwd else None
    if cwd is not None and not os.path.isdir(cwd):
        sys.stderr.write(f"qwenctl mcp: --cwd is not a directory: {cwd}\n")
        return 2
    import anyio

    from qwenctl.mcp_link import DaemonLink

    link = DaemonLink(args.socket, autostart=not args.no_autostart, timeout=args.timeout)
    try:
        anyio.run(build_server(link, cwd).run_stdio_async)
    finally:
        link.close()
    return 0


class Project:
    """Which directory a request is about."""

    def __init__(self, fixed: str | None) -> None:
        self.fixed = fixed

    async def resolve(self, session: Any) -> str:
        import anyio

        from qwenctl.mcp_link import root_to_dir

        if self.fixed is not None:
            return self.fixed
        caps = getattr(session, "client_capabilities", None)
        if caps is not None and getattr(caps, "roots", None) is not None:
            with anyio.move_on_after(ROOTS_TIMEOUT_S):
                try:
                    with warnings.catch_warnings():  # roots are deprecated in the newest spec
                        warnings.simplefilter("ignore")
                        listed = await session.list_roots()
                except Exception:  # noqa: BLE001 - a client that cannot answer: use the cwd
                    listed = None
                for root in (listed.roots if listed is not None else []):
                    found = root_to_dir(str(root.uri))
                    if found is not None:
                        return str(found)
        return os.getcwd()


def build_server(link: "DaemonLink", cwd: str | None) -> Any:
    """The MCPServer for one stdio session. The SDK is imported only here, and this module
    has no ``from __future__ import annotations``: the SDK evaluates the tools' annotations,
    which name the locally imported ``Context``."""
    import anyio
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.shared.exceptions import MCPError
    from mcp.types import (
        INVALID_PARAMS,
        GetPromptResult,
        ListPromptsResult,
        ListResourcesResult,
        Prompt,
        PromptMessage,
        ReadResourceResult,
        Resource,
        TextContent,
        TextResourceContents,
    )

    from qwenctl.mcp_link import (
        ToolFailure,
        memory_uri,
        render_candidates,
        render_instructions,
        render_recall,
        render_removed,
        render_skills,
    )

    project = Project(cwd)

    async def daemon(method: Method[Any, Any], params: Any) -> Any:
        """A tool's typed call: a failure is the tool's error."""
        try:
            return await link.request(method, params)
        except ToolFailure as exc:
            raise ToolError(str(exc)) from None

    async def resource_call(method: Method[Any, Any], params: Any) -> Any:
        """A resource's or prompt's typed call: a failure is -32602 to the MCP client."""
        try:
            return await link.request(method, params)
        except ToolFailure as exc:
            raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None

    async def instructions_text(where: str) -> str:
        prompt = await link.request(methods.PROMPT_SYSTEM, iwire.PromptSystemParams(cwd=where))
        files = await link.request(methods.INSTRUCTIONS_FILES, iwire.CwdParams(cwd=where))
        return render_instructions(prompt, files)

    class QwenctxServer(MCPServer):  # type: ignore[misc]
        """MCPServer whose resources and prompts are the daemon's, listed live."""

        async def _handle_list_resources(self, rctx: Any, params: Any) -> Any:
            where = await project.resolve(rctx.session)
            docs = (await resource_call(methods.MEMORY_LIST, mwire.ListParams(cwd=where))).docs
            resources = [Resource(uri=INSTRUCTIONS_URI, name="project instructions",
                                  description="QWEN.md layering, rules and the memory index "
                                              f"for {where}", mime_type="text/markdown")]
            resources += [Resource(uri=memory_uri(d), name=d.name,
                                   description=d.description or None,
                                   mime_type="text/markdown") for d in docs]
            return ListResourcesResult(resources=resources)

        async def _handle_read_resource(self, rctx: Any, params: Any) -> Any:
            uri = str(params.uri)
            where = await project.resolve(rctx.session)
            if uri == INSTRUCTIONS_URI:
                try:
                    text = await instructions_text(where)
                except ToolFailure as exc:
                    raise MCPError(code=INVALID_PARAMS, message=str(exc)) from None
            elif uri.startswith(MEMORY_URI_PREFIX):
                listed = await resource_call(methods.MEMORY_LIST, mwire.ListParams(cwd=where))
                docs = listed.docs
                match = next((d for d in docs if memory_uri(d) == uri), None)
                if match is None:
                    raise MCPError(code=INVALID_PARAMS, message=f"no such memory: {uri}",
                                   data={"uri": uri})
                try:  # a path the daemon listed for this project, not one the client chose
                    text = await anyio.Path(match.path).read_text(encoding="utf-8")
                    from qwenctxd.secrets import redact  # lazy: qwenctl's start-up stays lean

                    text = redact(text).text  # a hand-written key never leaves in a resource
                except OSError as exc:
                    raise MCPError(code=INVALID_PARAMS, message=f"{uri}: {exc.strerror}",
                                   data={"uri": uri}) from None
            else:
                raise MCPError(code=INVALID_PARAMS, message=f"unknown resource: {uri}",
                               data={"uri": uri})
            return ReadResourceResult(contents=[TextResourceContents(
                uri=uri, text=text, mime_type="text/markdown")])

        async def _handle_list_prompts(self, rctx: Any, params: Any) -> Any:
            where = await project.resolve(rctx.session)
            listed = await resource_call(methods.SKILLS_LIST, kwire.ListParams(cwd=where))
            return ListPromptsResult(prompts=[
                Prompt(name=s.name, description=s.description) for s in listed.skills])

        async def _handle_get_prompt(self, rctx: Any, params: Any) -> Any:
            where = await project.resolve(rctx.session)
            loaded = await resource_call(methods.SKILLS_LOAD,
                                         kwire.LoadParams(cwd=where, name=params.name))
            return GetPromptResult(
                description=f"the {loaded.name} skill",
                messages=[PromptMessage(role="user", content=TextContent(text=loaded.content))])

    server = QwenctxServer(SERVER_NAME, instructions=SERVER_INSTRUCTIONS, log_level="WARNING")

    @server.tool(structured_output=False)  # text only: no duplicate {"result": …} copy
    async def recall_memory(query: str, ctx: Context) -> str:
        """Recall the saved memories (user preferences, feedback, project facts, references)
        relevant to `query`; returns them as text, or says that none is relevant."""
        where = await project.resolve(ctx.session)
        return render_recall(query, await daemon(methods.MEMORY_RECALL,
                                                 mwire.RecallParams(cwd=where, query=query)))

    @server.tool(structured_output=False)  # text only: no duplicate {"result": …} copy
    async def save_memory(type: Literal["user", "feedback", "project", "reference"], name: str,
                          description: str, body: str, ctx: Context,
                          scope: Literal["project", "user", "team"] = "project") -> str:
        """Save one memory document and return the path written. `type`: user (who the user
        is), feedback (how they want you to work), project (facts about this project),
        reference (where to find things). `name` is a short title (saving the same name again
        updates it), `description` one line, `body` the content. `scope`: project (default),
        user (every project), team (committed in the repository; refused if it holds a
        secret). A secret in a project or user memory is replaced by `[redacted: <rule>]`
        before the file is written; a second line then says which."""
        where = await project.resolve(ctx.session)
        saved = await daemon(methods.MEMORY_SAVE, mwire.SaveParams(
            cwd=where, type=type, name=name, description=description, body=body, scope=scope))
        lines = [saved.path]
        if saved.redacted:
            what = ", ".join(f"{r.rule} ×{r.count}" for r in saved.redacted)
            lines.append(f"Redacted before saving ({what}): secrets are never stored in "
                         "memory; the file holds [redacted: <rule>] in their place.")
        lines.extend(f"warning: {w}" for w in saved.warnings)
        return "\n".join(lines)

    @server.tool(structured_output=False)  # text only: no duplicate {"result": …} copy
    async def forget_memory(query: str, ctx: Context, paths: list[str] | None = None) -> str:
        """Forget memories. Without `paths`: list the memories matching `query` (with their
        paths). With `paths` (taken from that list): remove those memories."""
        where = await project.resolve(ctx.session)
        if paths:
            out = await daemon(methods.MEMORY_FORGET, mwire.ForgetParams(cwd=where, paths=paths))
            return render_removed(out.removed)
        found = await daemon(methods.MEMORY_FORGET_CANDIDATES,
                             mwire.ForgetCandidatesParams(cwd=where, query=query))
        return render_candidates(query, found.candidates)

    @server.tool(structured_output=False)  # text only: no duplicate {"result": …} copy
    async def list_skills(ctx: Context) -> str:
        """List the skills available in this project (name, level, description)."""
        where = await project.resolve(ctx.session)
        return render_skills(await daemon(methods.SKILLS_LIST, kwire.ListParams(cwd=where)))

    @server.tool(structured_output=False)  # text only: no duplicate {"result": …} copy
    async def load_skill(name: str, ctx: Context) -> str:
        """Load a skill by name: its instructions, starting with its base directory."""
        where = await project.resolve(ctx.session)
        loaded = await daemon(methods.SKILLS_LOAD, kwire.LoadParams(cwd=where, name=name))
        return loaded.content

    @server.tool(structured_output=False)  # text only: no duplicate {"result": …} copy
    async def project_instructions(ctx: Context) -> str:
        """The project's instructions (QWEN.md / AGENTS.md layering, rules, the memory
        index), followed by the list of files they come from."""
        where = await project.resolve(ctx.session)
        try:
            return await instructions_text(where)
        except ToolFailure as exc:
            raise ToolError(str(exc)) from None

    @server.tool(structured_output=False)  # text only: no duplicate {"result": …} copy
    async def search_sessions(query: str, ctx: Context, limit: int = 10,
                              all_projects: bool = False) -> str:
        """Search what was said in past conversations (this project's, or every project's with
        `all_projects`): every word must match, "quoted phrases" in order. Returns the best
        entries with their session id, entry number, time, role and a snippet."""
        from qwenctl.search_cmds import agent_params, agent_text

        where = await project.resolve(ctx.session)
        res = await daemon(methods.SESSION_SEARCH, agent_params(
            query, limit=limit, all_projects=all_projects, cwd=where))
        return agent_text(res, query)

    return server
