"""A session as a notebook: the agent's code and what it showed, in nbformat 4.

The session's `python` calls become code cells, each with the outputs its call showed (the stored
observation's `outputs`, which are already nbformat-like: docs/events.md, `tool_result`); what people
and the model said becomes Markdown cells between them, so the notebook reads as the session went.
Nothing here runs code: the outputs are those the hands recorded. Used by `workbench export --ipynb`,
`GET /workbench/api/sessions/{id}/notebook`, `wb.notebook()` and the sidebar's *Open as notebook*.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

NBFORMAT, NBFORMAT_MINOR = 4, 5
MAX_MARKDOWN = 100_000  # characters of one Markdown cell (a huge message is cut, and says so)
# what nbformat allows of each output type; anything else the hands keep (display ids, notes) is left out
OUTPUT_KEYS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "stream": ("name", "text"),
    "display_data": ("data", "metadata"),
    "execute_result": ("data", "metadata", "execution_count"),
    "error": ("ename", "evalue", "traceback"),
})


def session_notebook(session: dict[str, Any], events: Iterable[Any]) -> dict[str, Any]:
    """The notebook (a JSON-ready dict, nbformat 4.5) of a session's events (Event objects, in seq order)."""
    cells: list[dict[str, Any]] = []
    calls: dict[str, dict[str, Any]] = {}  # tool_use id -> its code cell, to take its outputs
    count = 0
    title = str(session.get("title") or session.get("id") or "session")
    cells.append(_markdown(f"# {_line(title)}\n\nSession `{session.get('id', '?')}`, model `{session.get('model', '?')}`: "
                           "the agent's code and what it showed, exported from the workbench log. The outputs are "
                           "those recorded when the code ran; running a cell again runs it in your kernel."))
    for ev in events:
        p = ev.payload if isinstance(ev.payload, dict) else {}
        if ev.type == "user_message" and isinstance(p.get("text"), str):
            cells.append(_markdown("**User:**\n\n" + _cut(p["text"])))
        elif ev.type == "assistant_turn":
            content = (p.get("message") or {}).get("content") if isinstance(p.get("message"), dict) else None
            for block in content if isinstance(content, list) else []:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "text" and isinstance(block.get("text"), str) and block["text"].strip():
                    cells.append(_markdown("**Agent:**\n\n" + _cut(block["text"])))
                elif block.get("type") == "tool_use" and block.get("name") == "python":
                    code = (block.get("input") or {}).get("code") if isinstance(block.get("input"), dict) else None
                    if isinstance(code, str):
                        count += 1
                        cell: dict[str, Any] = {"cell_type": "code", "execution_count": count, "metadata": {"workbench": {
                            "session": session.get("id"), "tool_use_id": block.get("id"), "seq": ev.seq}},
                            "outputs": [], "source": code}
                        cells.append(cell)
                        if isinstance(block.get("id"), str):
                            calls[block["id"]] = cell
        elif ev.type == "tool_result" and p.get("tool_use_id") in calls:
            cell = calls.pop(p["tool_use_id"])
            obs = p.get("observation")
            outputs = obs.get("outputs") if isinstance(obs, dict) else None
            cell["outputs"] = _outputs(outputs, cell["execution_count"], p)
    for n, cell in enumerate(cells):  # nbformat 4.5: every cell has an id
        cell["id"] = f"wb-{n}"
    return {"cells": cells, "metadata": {
        **python_kernel_metadata(),
        "workbench": {"session": session.get("id"), "model": session.get("model"), "title": title}},
        "nbformat": NBFORMAT, "nbformat_minor": NBFORMAT_MINOR}


def python_kernel_metadata() -> dict[str, Any]:
    """`kernelspec` and `language_info` as JupyterLab writes them once this machine's `python3` kernel starts: a
    notebook opened with other values is marked modified at once (its metadata is rewritten from the kernel)."""
    import platform
    import sys

    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:  # ipykernel installs "Python 3 (ipykernel)"; a kernelspec of the user's may name it otherwise
        display = KernelSpecManager().get_kernel_spec("python3").display_name
    except NoSuchKernel:
        display = "Python 3 (ipykernel)"
    major = sys.version_info[0]
    return {
        "kernelspec": {"name": "python3", "display_name": display, "language": "python"},
        # ipykernel's kernel_info (the python3 kernel runs on this interpreter, as jupyter_client starts `python`)
        "language_info": {"name": "python", "version": platform.python_version(), "mimetype": "text/x-python",
                          "codemirror_mode": {"name": "ipython", "version": major}, "pygments_lexer": f"ipython{major}",
                          "nbconvert_exporter": "python", "file_extension": ".py"},
    }


def _outputs(outputs: Any, count: int, result: dict[str, Any]) -> list[dict[str, Any]]:
    """The stored outputs as nbformat outputs; a call without stored outputs (older logs, a lost kernel)
    shows the text the model read."""
    out: list[dict[str, Any]] = []
    for o in outputs if isinstance(outputs, list) else []:
        kind = o.get("output_type") if isinstance(o, dict) else None
        if not isinstance(kind, str) or kind not in OUTPUT_KEYS:
            continue
        clean = {"output_type": kind, **{k: o[k] for k in OUTPUT_KEYS[kind] if k in o}}
        if kind in ("display_data", "execute_result"):
            if not isinstance(clean.get("data"), dict):
                continue
            clean["metadata"] = clean.get("metadata") if isinstance(clean.get("metadata"), dict) else {}
            if kind == "execute_result":
                clean["execution_count"] = count
        if kind == "stream" and (clean.get("name") not in ("stdout", "stderr") or not isinstance(clean.get("text"), str)):
            continue
        if kind == "error":
            clean = {"output_type": "error", "ename": str(o.get("ename") or ""), "evalue": str(o.get("evalue") or ""),
                     "traceback": [str(t) for t in o.get("traceback") or [] if isinstance(t, str)]}
        out.append(clean)
    if not out and not isinstance(outputs, list):
        text = "\n".join(b.get("text", "") for b in result.get("content") or [] if isinstance(b, dict)
                         and b.get("type") == "text")
        if text:
            out.append({"output_type": "stream", "name": "stderr" if result.get("is_error") else "stdout", "text": text})
    return out


def _markdown(text: str) -> dict[str, Any]:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _cut(text: str) -> str:
    return text if len(text) <= MAX_MARKDOWN else text[:MAX_MARKDOWN] + f"\n\n[... {len(text) - MAX_MARKDOWN:,} characters cut ...]"


def _line(text: str) -> str:
    """A title as one line of Markdown heading (no newlines, no leading #)."""
    return " ".join(text.split())[:200].lstrip("#").strip() or "session"
