"""Convert between OpenAI chat messages (the daemon's history) and Gemini ``Content`` (Qwen Code's
session JSONL payload), both ways.

Qwen Code 0.24 records every ``message`` as a Gemini Content — ``{"role": "user"|"model",
"parts": [...]}`` — and refuses to resume a file whose records say ``role: "assistant"``. The
daemon keeps OpenAI messages in memory (they are what a chat-completions request carries) and
converts at the file boundary:

* user text → ``{"text": …}`` parts; ``image_url`` → ``inlineData`` (a ``data:`` URL) or
  ``fileData`` (any other URL); ``input_audio`` → ``inlineData``; ``video_url``/``file`` →
  ``fileData``/``inlineData``.
* assistant ``content`` → a text part, ``reasoning_content`` → a ``thought`` text part,
  ``tool_calls`` → ``functionCall`` parts ``{id, name, args}`` (arguments decoded from JSON).
* a tool message → a user Content with one ``functionResponse`` ``{id, name, response}``:
  ``{"output": text}``, or ``{"error": text}`` for a result the client marked ``is_error``;
  media in a tool result ride as the response's nested ``parts``.
* usage ``{prompt_tokens, completion_tokens}`` ↔ ``usageMetadata`` ``{promptTokenCount,
  candidatesTokenCount, totalTokenCount, …}``.

The reverse direction splits a user Content holding ``functionResponse`` parts into one tool
message per response (then a user message for any other parts), as Qwen Code's own OpenAI
converter does. A payload that already is an OpenAI message (files written before this format)
passes through unchanged, so old sessions still resume.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

RAW_ARGUMENTS_KEY = "__raw_arguments"
"""``args`` key holding tool-call arguments that were not a JSON object (kept verbatim)."""

ARGUMENTS_TEXT_KEY = "qwenctxdArguments"
"""Part key (beside ``functionCall``) keeping the arguments string the model sent when it is
not ``JSON.stringify`` of ``args`` (other spacing or key order), so a resumed history is
byte-identical and the model server's prompt cache still matches. Qwen Code ignores it."""

NAMED_RESULT_KEY = "qwenctxdNamed"
"""Part key (beside ``functionResponse``): the tool message carried ``name`` itself, so the
resumed message does too (a chat-completions tool message needs none, and Qwen Code sends none)."""

UNKNOWN_TOOL = "unknown_tool"


def is_gemini_content(message: Any) -> bool:
    """True for a ``{role, parts}`` Content; False for an OpenAI message (or anything else)."""
    return isinstance(message, dict) and isinstance(message.get("parts"), list)


# -- OpenAI → Gemini ------------------------------------------------------------------------------


def _data_url(url: str) -> tuple[str, str] | None:
    """(mime type, base64 data) of a ``data:<mime>;base64,<data>`` URL, else None."""
    if not url.startswith("data:"):
        return None
    head, sep, data = url[5:].partition(",")
    if not sep or not head.endswith(";base64"):
        return None
    return head.removesuffix(";base64") or "application/octet-stream", data


def _guess_mime(url: str, default: str) -> str:
    import mimetypes

    return mimetypes.guess_type(url.split("?", 1)[0])[0] or default


def _media_part(part: dict[str, Any]) -> dict[str, Any] | None:
    """One OpenAI non-text content part as a Gemini part (None when it carries nothing)."""
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, dict) else image
        if not isinstance(url, str) or not url:
            return None
        inline = _data_url(url)
        if inline is not None:
            return {"inlineData": {"mimeType": inline[0], "data": inline[1]}}
        return {"fileData": {"mimeType": _guess_mime(url, "image/png"), "fileUri": url}}
    if kind == "input_audio":
        audio = part.get("input_audio") or {}
        fmt = str(audio.get("format") or "wav")
        return {"inlineData": {"mimeType": f"audio/{fmt}", "data": str(audio.get("data") or "")}}
    if kind == "video_url":
        video = part.get("video_url") or {}
        url = str(video.get("url") or "")
        inline = _data_url(url)
        if inline is not None:
            return {"inlineData": {"mimeType": inline[0], "data": inline[1]}}
        return {"fileData": {"mimeType": _guess_mime(url, "video/mp4"), "fileUri": url}}
    if kind == "file":
        file = part.get("file") or {}
        data = str(file.get("file_data") or "")
        inline = _data_url(data)
        name = file.get("filename")
        if inline is not None:
            out: dict[str, Any] = {"mimeType": inline[0], "data": inline[1]}
            if isinstance(name, str):
                out["displayName"] = name
            return {"inlineData": out}
        uri = str(file.get("file_id") or data)
        return {"fileData": {"mimeType": _guess_mime(str(name or uri), "application/octet-stream"),
                             "fileUri": uri}}
    return None


def _content_parts(content: Any) -> list[dict[str, Any]]:
    """OpenAI ``content`` (a string or a list of parts) as Gemini parts."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}]
    parts: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else []:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            parts.append({"text": str(part.get("text") or "")})
        else:
            media = _media_part(part)
            if media is not None:
                parts.append(media)
    return parts


def _decode_arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {RAW_ARGUMENTS_KEY: arguments}
    return value if isinstance(value, dict) else {RAW_ARGUMENTS_KEY: arguments}


def _function_response(msg: dict[str, Any], tool_names: dict[str, str]) -> dict[str, Any]:
    call_id = str(msg.get("tool_call_id") or "")
    name = msg.get("name") or tool_names.get(call_id) or UNKNOWN_TOOL
    content = msg.get("content")
    parts = _content_parts(content)
    text = "".join(p["text"] for p in parts if "text" in p)
    media = [p for p in parts if "text" not in p]
    key = "error" if msg.get("is_error") else "output"
    response: dict[str, Any] = {"id": call_id, "name": name, "response": {key: text}}
    if media:
        response["parts"] = media
    out: dict[str, Any] = {"functionResponse": response}
    if msg.get("name"):
        out[NAMED_RESULT_KEY] = True
    return out


def to_content(msg: dict[str, Any], tool_names: dict[str, str] | None = None) -> dict[str, Any]:
    """One OpenAI message as one Gemini Content (a Content passes through unchanged).

    ``tool_names`` maps tool-call ids to names; the tool calls of an assistant message are
    added to it, and a tool message takes its ``functionResponse.name`` from it.
    """
    if is_gemini_content(msg):
        return msg
    names = tool_names if tool_names is not None else {}
    role = msg.get("role")
    if role == "assistant":
        parts: list[dict[str, Any]] = []
        reasoning = msg.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            parts.append({"text": reasoning, "thought": True})
        text = msg.get("content")
        if isinstance(text, list):
            text = "".join(p.get("text", "") for p in text if isinstance(p, dict))
        calls = msg.get("tool_calls") or []
        if isinstance(text, str) and (text or not calls):
            parts.append({"text": text})
        for call in calls:
            if not isinstance(call, dict):
                continue
            fn = call.get("function") or {}
            call_id = str(call.get("id") or "")
            name = str(fn.get("name") or UNKNOWN_TOOL)
            names[call_id] = name
            raw = fn.get("arguments")
            args = _decode_arguments(raw)
            part: dict[str, Any] = {"functionCall": {"id": call_id, "name": name, "args": args}}
            if isinstance(raw, str) and raw != _encode_arguments(args):
                part[ARGUMENTS_TEXT_KEY] = raw
            parts.append(part)
        return {"role": "model", "parts": parts or [{"text": ""}]}
    if role == "tool":
        return {"role": "user", "parts": [_function_response(msg, names)]}
    return {"role": "user", "parts": _content_parts(msg.get("content")) or [{"text": ""}]}


def to_contents(messages: Iterable[dict[str, Any]],
                tool_names: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """A whole OpenAI history as Gemini Contents; consecutive tool results share one Content."""
    names = tool_names if tool_names is not None else {}
    out: list[dict[str, Any]] = []
    prev_tool = False
    for msg in messages:
        content = to_content(msg, names)
        is_tool = not is_gemini_content(msg) and msg.get("role") == "tool"
        if is_tool and prev_tool and out:
            out[-1] = {"role": "user", "parts": [*out[-1]["parts"], *content["parts"]]}
        else:
            out.append(content)
        prev_tool = is_tool
    return out


def to_usage_metadata(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """OpenAI usage as Gemini ``usageMetadata`` (a usageMetadata passes through)."""
    if not usage:
        return None
    if "promptTokenCount" in usage:
        return usage
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    out = {"promptTokenCount": prompt, "candidatesTokenCount": completion,
           "totalTokenCount": int(usage.get("total_tokens") or prompt + completion)}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached:
        out["cachedContentTokenCount"] = int(cached)
    return out


# -- Gemini → OpenAI ------------------------------------------------------------------------------


def _openai_media(part: dict[str, Any]) -> dict[str, Any] | None:
    inline = part.get("inlineData")
    if isinstance(inline, dict):
        mime = str(inline.get("mimeType") or "application/octet-stream")
        data = str(inline.get("data") or "")
        if mime.startswith("audio/"):
            return {"type": "input_audio",
                    "input_audio": {"data": data, "format": mime.split("/", 1)[1]}}
        url = f"data:{mime};base64,{data}"
        if mime.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": url}}
        if mime.startswith("video/"):
            return {"type": "video_url", "video_url": {"url": url}}
        file: dict[str, Any] = {"file_data": url}
        if isinstance(inline.get("displayName"), str):
            file["filename"] = inline["displayName"]
        return {"type": "file", "file": file}
    data = part.get("fileData")
    if isinstance(data, dict):
        mime = str(data.get("mimeType") or "")
        uri = str(data.get("fileUri") or "")
        if mime.startswith("image/"):
            return {"type": "image_url", "image_url": {"url": uri}}
        if mime.startswith("video/"):
            return {"type": "video_url", "video_url": {"url": uri}}
        return {"type": "file", "file": {"file_id": uri}}
    return None


def _openai_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Gemini parts as OpenAI user content: a string for one text part, else a part list."""
    out: list[dict[str, Any]] = []
    for part in parts:
        if isinstance(part.get("text"), str) and not part.get("thought"):
            out.append({"type": "text", "text": part["text"]})
        else:
            media = _openai_media(part)
            if media is not None:
                out.append(media)
    if len(out) == 1 and out[0]["type"] == "text":
        return out[0]["text"]
    return out if out else ""


def _response_text(response: Any) -> tuple[str, bool]:
    """(text, is_error) of a functionResponse ``response`` object."""
    if not isinstance(response, dict):
        return ("" if response is None else json.dumps(response, ensure_ascii=False)), False
    for key, err in (("output", False), ("error", True)):
        value = response.get(key)
        if isinstance(value, str):
            return value, err
    if "content" in response and isinstance(response["content"], str):
        return response["content"], False
    return json.dumps(response, ensure_ascii=False), False


def _tool_message(part: dict[str, Any]) -> dict[str, Any]:
    fr = part["functionResponse"]
    text, is_error = _response_text(fr.get("response"))
    media = [m for m in (_openai_media(p) for p in fr.get("parts") or [] if isinstance(p, dict))
             if m is not None]
    content: str | list[dict[str, Any]] = text
    if media:
        content = [{"type": "text", "text": text}, *media] if text else media
    msg: dict[str, Any] = {"role": "tool", "tool_call_id": str(fr.get("id") or ""),
                           "content": content}
    if part.get(NAMED_RESULT_KEY) and fr.get("name"):
        msg["name"] = str(fr["name"])
    if is_error:
        msg["is_error"] = True
    return msg


def _encode_arguments(args: Any) -> str:
    if isinstance(args, dict) and set(args) == {RAW_ARGUMENTS_KEY} and isinstance(
            args[RAW_ARGUMENTS_KEY], str):
        return args[RAW_ARGUMENTS_KEY]
    # JSON.stringify's form, so a call recorded by Qwen Code reads back as it sent it
    return json.dumps(args if args is not None else {}, ensure_ascii=False, separators=(",", ":"))


def to_messages(content: dict[str, Any]) -> list[dict[str, Any]]:
    """One Gemini Content as OpenAI messages (an OpenAI message comes back alone, unchanged).

    A model Content is one assistant message; a user Content is one tool message per
    ``functionResponse`` part, then a user message for its other parts (if any).
    """
    if not is_gemini_content(content):
        return [content] if isinstance(content, dict) and content.get("role") else []
    parts = [p for p in content["parts"] if isinstance(p, dict)]
    if content.get("role") == "model":
        thoughts = [p["text"] for p in parts if p.get("thought") and isinstance(p.get("text"), str)]
        texts = [p["text"] for p in parts
                 if not p.get("thought") and isinstance(p.get("text"), str)]
        calls = []
        for p in parts:
            fc = p.get("functionCall")
            if isinstance(fc, dict):
                raw = p.get(ARGUMENTS_TEXT_KEY)
                arguments = raw if isinstance(raw, str) else _encode_arguments(fc.get("args"))
                calls.append({"id": str(fc.get("id") or ""), "type": "function",
                              "function": {"name": str(fc.get("name") or UNKNOWN_TOOL),
                                           "arguments": arguments}})
        msg: dict[str, Any] = {"role": "assistant"}
        if texts or not calls:
            msg["content"] = "".join(texts)
        if calls:
            msg["tool_calls"] = calls
        if thoughts:
            msg["reasoning_content"] = "".join(thoughts)
        return [msg]
    out = [_tool_message(p) for p in parts
           if isinstance(p.get("functionResponse"), dict)]
    rest = [p for p in parts if "functionResponse" not in p]
    if rest or not out:
        out.append({"role": "user", "content": _openai_content(rest)})
    return out


def to_message_list(contents: Iterable[Any]) -> list[dict[str, Any]]:
    """A list of Contents (or legacy OpenAI messages, or a mix) as OpenAI messages."""
    out: list[dict[str, Any]] = []
    for c in contents:
        if isinstance(c, dict):
            out.extend(to_messages(c))
    return out


def to_openai_usage(meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """``usageMetadata`` as OpenAI usage (an OpenAI usage dict passes through)."""
    if not meta:
        return None
    if "promptTokenCount" not in meta:
        return meta
    completion = int(meta.get("candidatesTokenCount") or 0) + int(
        meta.get("thoughtsTokenCount") or 0)
    return {"prompt_tokens": int(meta.get("promptTokenCount") or 0),
            "completion_tokens": completion}


def learn_tool_names(messages: Iterable[dict[str, Any]], tool_names: dict[str, str]) -> None:
    """Record the id → name of every tool call in ``messages`` (OpenAI form) in ``tool_names``."""
    for m in messages:
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or []:
                if isinstance(call, dict):
                    fn = call.get("function") or {}
                    tool_names[str(call.get("id") or "")] = str(fn.get("name") or UNKNOWN_TOOL)


def display_text(msg: dict[str, Any]) -> str | None:
    """The user's own words of a user message whose content also carries ``<system-reminder>``
    parts, for the record's ``systemPayload.displayText`` (what Qwen Code shows as the prompt in
    ``qwen sessions list`` and its UI); None when there is nothing to hide."""
    content = msg.get("content")
    if msg.get("role") != "user" or not isinstance(content, list):
        return None
    texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    own = [t for t in texts if isinstance(t, str) and not t.lstrip().startswith("<system-reminder>")]
    if len(own) == len(texts):
        return None
    return "\n".join(own)
