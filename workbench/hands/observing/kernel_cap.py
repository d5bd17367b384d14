"""An output budget installed *inside* a kernel, so floods never leave it.

Capping only on the receiving side would still ship a gigabyte print over
ZMQ into the server's memory. The hands send this file's source to each new
kernel (a silent execute, so it works for every backend, gateways included)
and call `install(limit)`: sys.stdout and sys.stderr then keep at most
`limit` characters per execution and per stream (counted since the last
`clear_output`); of what comes after, the kernel keeps only the last
`limit // 2 + 1` characters, and at the end of an execution that dropped
some it publishes how much, with that tail, as a display of MIME type
DROPPED_MIME, which the hands fold into the stream (the final state of a
long run matters most) and into their truncation note.
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
    tails: dict = {"stdout": [], "stderr": []}  # what came after the limit, the last of it kept
    room_after = limit - limit // 2

    def keep_tail(name, s):
        tail = tails[name]
        tail.append(s[-room_after:])
        n = sum(len(t) for t in tail)
        while len(tail) > 1 and n - len(tail[0]) >= room_after:
            n -= len(tail.pop(0))
        if len(tail) > 64:  # many small writes: join them
            tail[:] = ["".join(tail)[-room_after:]]

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
            keep_tail(name, s[max(room, 0):])
            return n

        return capped_write

    def wrap():
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if not getattr(stream.write, "_workbench_capped", False):
                stream.write = capped(name, stream.write)
                stream.write._workbench_capped = True

    def reset(*args):
        for d in (kept, dropped):
            d["stdout"] = d["stderr"] = 0
        for t in tails.values():
            t.clear()

    def pre(*args):
        # wrap here, in each cell, not at install: the cell that installs this is itself
        # wrapped by IPython, which puts the stream's write back when that cell ends
        wrap()
        reset()

    def report(*args):
        if dropped["stdout"] or dropped["stderr"]:
            tail = {name: "".join(t)[-room_after:] for name, t in tails.items()}
            counts = {name: dropped[name] - len(tail[name]) for name in tail}
            publish_display_data({DROPPED_MIME: {**counts, "tail": tail}})

    pub = ip.display_pub
    clear = pub.clear_output

    def clear_output(*args, **kw):
        # what was shown is gone, so the budget starts again: a progress loop keeps its last frame
        for name in ("stdout", "stderr"):
            getattr(sys, name).flush()
        reset()
        return clear(*args, **kw)

    pub.clear_output = clear_output
    ip.events.register("pre_execute", pre)
    ip.events.register("post_execute", report)
