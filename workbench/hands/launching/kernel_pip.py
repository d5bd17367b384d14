"""`%pip` in a workbench kernel: installs go to the session's own folder, and a blocked network says so.

The hands send this file's source to each kernel once it serves a session (like kernel_cap.py)
and call `install()` in the session's working directory. The kernel's Python is shared and
read-only (in the sandbox), so packages go to `.packages` in the session's working directory
(its workspace, under the workspace's quota), which is put on `sys.path` and set as `PIP_TARGET`
(so `!pip install` and subprocesses install there too); the folder is made by the first install. `%pip` runs pip with its output streamed
as it comes; when an install fails because the package index cannot be reached (the sandbox's
network goes only through the session's egress proxy, by its policy), it says so plainly and
what to do, instead of leaving the model with pip's retry noise.
"""

NO_NETWORK = ("ProxyError", "Tunnel connection failed", "NewConnectionError", "Temporary failure in name resolution",
              "Network is unreachable", "Failed to establish a new connection", "No route to host",
              "Connection refused", "403 Forbidden")

NOTE = "Note: you may need to restart the kernel to use updated packages."

BLOCKED = ("%pip install could not reach the package index: this kernel reaches the network only through the "
           "session's egress proxy, and the session's egress policy does not allow the index's host (or no "
           "network at all). Ask the user to allow the package index in the session's egress settings, or "
           "work without the package.")


def install():
    """Make `.packages` here the session's package folder and `%pip` install into it."""
    import importlib
    import os
    import shlex
    import subprocess
    import sys

    from IPython import get_ipython

    target = os.path.join(os.getcwd(), ".packages")  # made by the first install (pip makes its target)
    if target not in sys.path:
        sys.path.append(target)  # after the shared site-packages: an install never shadows what the kernel runs on
    os.environ["PIP_TARGET"] = target

    def pip(line):
        """Run pip (installs go to this session's package folder)."""
        args = shlex.split(line)
        cmd = [sys.executable, "-m", "pip", *args]
        installing = args[:1] == ["install"]
        if installing:
            cmd += ["--retries", "1", "--timeout", "20"]  # one retry: pip says why a connection failed only then
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
        last: list = []
        for out in proc.stdout or ():
            print(out, end="")
            last = (last + [out])[-200:]
        code = proc.wait()
        said = "".join(last)
        if code and installing and any(m in said for m in NO_NETWORK):
            print(BLOCKED, file=sys.stderr)
        elif code == 0 and installing:
            importlib.invalidate_caches()  # forgets that the folder was missing when first looked at
            print(f"(installed into {target}, this session's own package folder: a package not imported yet can be "
                  "imported now)")
        print(NOTE)  # IPython's %pip says it after every run: a package imported before keeps its old version

    get_ipython().register_magic_function(pip, "line", "pip")
