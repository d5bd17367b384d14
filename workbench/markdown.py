"""Markdown as people read it, safe to put in a page: a model's answer, a memory's text.

CommonMark with tables; raw HTML in the text is escaped (a `<script>` is shown as text), images are not
rendered (a page would fetch whatever URL the text names each time it is shown), and markdown-it refuses
javascript:, vbscript:, file: and data: links. Fenced code is highlighted by Pygments with inline styles (no
stylesheet needed in a widget or a notebook's saved output). With `math`, `$...$` and `$$...$$` are kept whole
as `\\(...\\)` and `\\[...\\]` for a typesetter (ipywidgets' HTMLMath, JupyterLab's MathJax) instead of being
read as emphasis (`$a_1 b_1$`).
"""

from __future__ import annotations

import functools
import html
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from markdown_it import MarkdownIt


def _highlight(code: str, lang: str, _attrs: Any) -> str:
    """A fence's code as Pygments' inline-styled spans (markdown-it wraps them in <pre><code>); '' leaves it plain."""
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        lexer = get_lexer_by_name((lang or "").strip() or "text", stripnl=False, ensurenl=False)
    except ClassNotFound:
        return ""
    return highlight(code, lexer, HtmlFormatter(noclasses=True, nowrap=True, style="default"))


def _math(content: str, opts: dict[str, Any]) -> str:
    escaped = html.escape(content)
    return f"\\[{escaped}\\]" if opts.get("display_mode") else f"\\({escaped}\\)"


@functools.cache
def _renderer(math: bool, highlight: bool) -> MarkdownIt:
    # imported at the first rendering, not with the module: the server imports this module at start (the plugins'
    # text helpers) and renders nothing until a page asks; markdown-it is about 60 ms of a quiet start's CPU
    from markdown_it import MarkdownIt

    options = {"html": False, "highlight": _highlight} if highlight else {"html": False}
    md = MarkdownIt("commonmark", options).enable("table").disable("image")
    if math:
        from mdit_py_plugins.dollarmath import dollarmath_plugin

        dollarmath_plugin(md, allow_space=False, renderer=_math)  # as pandoc: "$5 and $6" stays money, not math
    return md


def markdown_html(text: str, *, math: bool = False, highlight: bool = True) -> str:
    """Markdown `text` as HTML: raw HTML shown as text, links only to safe schemes, code highlighted (unless not
    `highlight`: plain `<pre><code>`)."""
    return _renderer(math, highlight).render(str(text))
