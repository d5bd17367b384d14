"""One line for the person and the model on how to get past an error the hands cannot fix themselves.

A module missing from the hands' environment is the common one: the hands run on a Python environment
bound read-only into the sandbox, with no network, so code there cannot install it; the person can.
"""

from __future__ import annotations

import re
from types import MappingProxyType
from typing import Any

MISSING = re.compile(r"No module named '([A-Za-z_][\w.]{0,100})'")
# import names whose package on the index is named otherwise
PACKAGES = MappingProxyType({"sklearn": "scikit-learn", "skimage": "scikit-image", "cv2": "opencv-python", "PIL": "Pillow",
                             "yaml": "PyYAML", "bs4": "beautifulsoup4", "dateutil": "python-dateutil"})


def missing_module(error: dict[str, Any] | None, python: str) -> str | None:
    """How to install the module a ModuleNotFoundError names into the hands' environment (`python`: the
    interpreter its kernels run on, "" when not on this machine); None for any other error."""
    if not error or error.get("ename") != "ModuleNotFoundError":
        return None
    found = MISSING.search(str(error.get("evalue", "")))
    if found is None:
        return None
    module = found.group(1).split(".")[0]
    package = PACKAGES.get(module, module)
    if not python:
        return (f"`{module}` is not installed where the hands run (the kernel gateway's Python): install it in the "
                f"environment of the gateway's kernels with `pip install {package}`, then restart the hands")
    return (f"`{module}` is not installed in the hands' Python environment ({python}, read-only and offline in the "
            f"sandbox): install it there with `{python} -m pip install {package}`, then restart the hands")
