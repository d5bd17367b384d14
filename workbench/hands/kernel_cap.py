"""An output budget installed *inside* a kernel, so floods never leave it.

Capping only on the receiving side would still ship a gigabyte print over
ZMQ into the server's memory. The hands send this file's source to each new
kernel (a silent execute, so it works for every backend, gateways included)
and call `install(limit)`: sys.stdout and sys.stderr then keep at most
`limit` characters per execution, and at the end of an execution that
dropped some, the kernel publishes how much as a display of MIME type
DROPPED_MIME, which the hands fold into their truncation note.
Writes below the Python level (a C library or a subprocess writing to
fd 1) are not seen here; the hands' own cap still bounds those.
"""

DROPPED_MIME = "application/vnd.workbench.dropped+json"


def install(limit):
    """Cap sys.stdout and sys.stderr at `limit` characters per execution."""
    import sys

    from IPython import get_ipython
    from IPython.display import publish_display_data

    ip = get_ipython()
    if hasattr(ip, "_tee"):
        # IPython (9+) wraps each cell's stream writes to keep every chunk in its output
        # history, in memory and then in its sqlite file: a flood would pile up there
        # even though we drop it. The workbench's log is the history; turn this one off.
        import contextlib

        ip._tee = lambda channel: contextlib.nullcontext()
    kept = {"stdout": 0, "stderr": 0}
    dropped = {"stdout": 0, "stderr": 0}

    def capped(name, write):
        def capped_write(s):
            n = len(s)
            room = limit - kept[name]
            if n <= room:
                kept[name] += n
                return write(s)
            if room > 0:
                write(s[:room])
                kept[name] = limit
            dropped[name] += n - max(room, 0)
            return n

        return capped_write

    def wrap():
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if not getattr(stream.write, "_workbench_capped", False):
                stream.write = capped(name, stream.write)
                stream.write._workbench_capped = True

    def reset(*args):
        # wrap here, in each cell, not at install: the cell that installs this is itself
        # wrapped by IPython, which puts the stream's write back when that cell ends
        wrap()
        for d in (kept, dropped):
            d["stdout"] = d["stderr"] = 0

    def report(*args):
        if dropped["stdout"] or dropped["stderr"]:
            publish_display_data({DROPPED_MIME: dict(dropped)})

    ip.events.register("pre_execute", reset)
    ip.events.register("post_execute", report)
