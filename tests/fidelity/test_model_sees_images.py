"""Done when: a figure, a formula, an SVG plot and an Image returned as a cell's value reach the model as images.

Checked where it counts: in the request the model receives (the fake Messages API records it), through
the real SDK, the brain and sandboxed hands.
"""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from workbench.testing import Reply

MODEL = "claude-opus-5-5"

CELLS = {
    "matplotlib figure": "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([1, 3, 2])\nplt.close(fig)\nfig",
    "sympy expression": "import sympy\nsympy.init_printing()\nx = sympy.Symbol('x')\nsympy.Integral(sympy.sqrt(1 / x), x)",
    "svg plot": "%config InlineBackend.figure_formats = ['svg']\nimport matplotlib.pyplot as plt\n"
                "fig, ax = plt.subplots()\nax.bar(['a', 'b'], [1, 2])\nplt.close(fig)\nfig",
    "Image(...)": "from PIL import Image as P\nP.new('RGB', (64, 32), 'teal').save('teal.png')\n"
                  "from IPython.display import Image\nImage('teal.png')",
}


@pytest.mark.asyncio
async def test_cell_values_that_are_pictures_reach_the_model_as_image_blocks(api, brain, log):
    api.use([Reply(code=list(CELLS.values())), Reply(text="seen")])
    sid = brain.create_session(model=MODEL)["id"]
    assert await brain.run_turn(sid, "show me") == "end_turn"
    results = api.requests[-1]["messages"][-1]["content"]
    assert [r["type"] for r in results] == ["tool_result"] * len(CELLS)
    for name, result in zip(CELLS, results, strict=True):
        content = result["content"]
        assert not result.get("is_error"), (name, content)
        images = [b for b in content if b["type"] == "image"]
        assert len(images) == 1, (name, content)
        source = images[0]["source"]
        assert source["media_type"] == "image/png", name
        with Image.open(io.BytesIO(base64.b64decode(source["data"]))) as im:
            assert im.format == "PNG" and min(im.size) >= 16, (name, im.size)
        # the default repr of the object is not what the model reads instead
        text = " ".join(b.get("text", "") for b in content)
        assert "<Figure size" not in text and "object>" not in text, (name, text)
    # the log keeps the full bundles: the SVG as sent, with the PNG rendered from it beside
    stored = [e.payload["observation"] for e in log.events(sid, types=["tool_result"])]
    (svg,) = [o for o in stored[2]["outputs"] if o["output_type"] == "execute_result"]
    assert svg["data"]["image/svg+xml"].lstrip().startswith(("<?xml", "<svg")) and svg["svg_png"]
    (fig,) = [o for o in stored[0]["outputs"] if o["output_type"] == "execute_result"]
    assert set(fig["data"]) >= {"text/plain", "image/png"}
