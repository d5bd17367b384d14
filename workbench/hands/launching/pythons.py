"""Which Python a session's kernels run on: the host's, or an environment the session names.

`config.hands.python` names an installed Jupyter kernelspec (a Python kernel, as
`python -m ipykernel install --user --name NAME` writes it from the environment it should run) or an absolute
path to a Python interpreter that has ipykernel. The launchers run the session's kernels (and its spare) on it; a
sandbox binds that environment read-only (its prefix and base prefix), as it does the host's.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from ...errors import ConfigError

HOW = "config.hands.python names an installed Jupyter kernelspec of a Python kernel, or a Python interpreter's absolute path"


def session_python(name: str) -> str:
    """The interpreter `name` (a kernelspec's name or an absolute path) stands for; ConfigError saying what exists."""
    if os.path.isabs(name):
        path = Path(name)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise ConfigError(f"the hands' Python {name!r} is not an executable file ({HOW})")
        return str(path)
    # jupyter_client at the first kernelspec named: a command that starts no kernel (a CLI listing) never imports it
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    ksm = KernelSpecManager()
    try:
        spec = ksm.get_kernel_spec(name)
    except NoSuchKernel:
        installed = ", ".join(sorted(ksm.find_kernel_specs())) or "none"
        raise ConfigError(f"no Jupyter kernelspec is named {name[:80]!r}; installed: {installed} ({HOW})") from None
    if (spec.language or "").lower() != "python" or not spec.argv:
        raise ConfigError(f"the kernelspec {name!r} is not a Python kernel (language {spec.language!r}; {HOW})")
    exe = spec.argv[0]
    if exe in ("python", "python3"):  # jupyter_client starts these with its own interpreter: the host's
        return sys.executable
    found = exe if os.path.isabs(exe) else shutil.which(exe)
    if not found or not os.access(found, os.X_OK):
        raise ConfigError(f"the kernelspec {name!r} runs {exe!r}, which is not an executable here ({HOW})")
    return found
