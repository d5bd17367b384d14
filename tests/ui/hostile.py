"""Script planted where a browser will show it: a session title, a user message, a kernel's
error and its output, all quoted as provenance by the offline dream into memory titles and text.

Every payload sets `top.wbXss` when it runs, so a page where none ran has no `wbXss`. The
payloads are short enough to survive whole in the dream's titles (it cuts them at 60-80
characters), and some open by closing the element or attribute they may land in.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

TITLE = """<img src=x onerror="top.wbXss='title'"> hostile session"""
PREFERENCE = """Always keep <img src=x onerror="top.wbXss='pref'"> as text."""
RAISED = """"'></pre><img src=x onerror="top.wbXss='error'">"""
PRINTED = """</textarea><script>top.wbXss='script'</script><svg onload="top.wbXss='svg'"></svg>"""
BIG = 20_000  # '<b>' printed this many times: oversized markup in the output

# The default scripted model runs each ```python block of the message, in order: the error,
# then the call that "fixed" it (the dream quotes both), then the oversized output.
MESSAGE = (f"{PREFERENCE}\n```python\nraise ValueError({RAISED!r})\n```\n"
           f"```python\nprint({PRINTED!r})\n```\n```python\nprint('<b>' * {BIG})\n```")

# What each payload shows once it is escaped: its text, visible on the page.
SHOWN = ["onerror=\"top.wbXss='error'\"", "<script>top.wbXss='script'</script>", "onerror=\"top.wbXss='pref'\""]

# The same kind of payload, put into the page as HTML by the test itself: it must run, or the
# page could not tell a planted script that ran from one that did not.
CONTROL = """<img src=x onerror="top.wbXss='control'">"""


def ran(page: Any) -> Any:
    """What the planted scripts left behind in the page (None when none ran)."""
    return page.evaluate("() => top.wbXss ?? null")


def assert_control_runs(page: Any) -> None:
    """Put CONTROL into the page as HTML and wait until it has run: the check above can fail here."""
    page.evaluate("html => { const d = document.createElement('div'); d.innerHTML = html; document.body.append(d); }", CONTROL)
    page.wait_for_function("() => top.wbXss === 'control'", timeout=10_000)


def record_and_dream(db_path: Path) -> dict[str, Any]:
    """Record the hostile session with a real kernel, run the scripted dream over it; returns the dream's result."""
    from workbench.hands.factory import HandsSettings
    from workbench.host import Host

    async def go() -> dict[str, Any]:
        async with Host.open(db_path, hands=HandsSettings(pool_size=0, registry_dir=str(db_path.parent / "kernels"))) as host:
            sid = host.brain.create_session(title=TITLE, model="scripted")["id"]
            assert await host.brain.run_turn(sid, MESSAGE) == "end_turn"
            memory = host.plugin("memory")
            dream_id = await memory.create_dream([sid], "scripted:dream")
            return dict(await memory.run_dream(dream_id), session_id=sid)

    result = asyncio.run(go())
    assert result["stop_reason"] == "end_turn" and len(result["proposed"]) >= 2, result
    return result
