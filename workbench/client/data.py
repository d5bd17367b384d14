"""Data between a notebook and a session's workspace: how a variable becomes a file, how a file comes back.

A variable is written by its type (docs/notebook.md, "Data between notebook and agent"):

| value                          | file              | kind        |
|--------------------------------|-------------------|-------------|
| pandas DataFrame (or Series)   | NAME.parquet when pyarrow is there and takes it, else NAME.pkl (and a warning says why) | dataframe |
| numpy array (not of objects)   | NAME.npy          | array       |
| str                            | NAME.txt          | text        |
| bytes                          | NAME.bin          | file        |
| JSON data (dict, list, number, bool, None; finite) | NAME.json | json |
| anything else                  | NAME.pkl (pickle) | pickle      |

A file comes back by its extension (`load`): parquet, csv, tsv → DataFrame; npy, npz → numpy;
json → its value; png, jpg, gif, webp, svg → an IPython Image (SVG); text extensions → str; other → bytes.
A pickle is refused unless asked for (`allow_pickle=True`): unpickling runs code, and the agent's
code, which wrote it, runs in a sandbox so that it cannot run code in your kernel.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import IO, Any

from ..errors import WorkbenchError

TEXT_EXTENSIONS = frozenset({".txt", ".md", ".py", ".log", ".html", ".xml", ".yaml", ".yml", ".toml",
                             ".ini", ".cfg", ".sql", ".r", ".sh", ".tex", ".rst"})
IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".gif", ".webp"})


@dataclass
class Packed:
    """A value (or a file) ready to upload: its bytes in `stream`, where it goes, what it is."""

    name: str  # the variable's name or the file's own name
    path: str  # in the workspace
    kind: str
    stream: IO[bytes]
    bytes: int
    describe: str  # for the note the agent reads
    warning: str = ""  # for the person: why it is not in the form they would expect (a pickle, not Parquet)


def _finite_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return True
    except (TypeError, ValueError, RecursionError):
        return False


def _spooled() -> IO[bytes]:
    return tempfile.SpooledTemporaryFile(max_size=8 << 20)


def _done(name: str, path: str, kind: str, out: IO[bytes], describe: str, warning: str = "") -> Packed:
    size = out.tell()
    out.seek(0)
    return Packed(name, path, kind, out, size, describe, warning)


def pack_value(name: str, value: Any) -> Packed:
    """A variable as a file of its type (see the module's table)."""
    out = _spooled()
    kind_of = type(value).__module__.split(".")[0], type(value).__name__
    if kind_of in (("pandas", "DataFrame"), ("pandas", "Series")):
        frame = value.to_frame() if kind_of[1] == "Series" else value
        shape = f"{frame.shape[0]} rows × {frame.shape[1]} columns"
        what = "pandas Series (as a one-column DataFrame)" if kind_of[1] == "Series" else "pandas DataFrame"
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            why = "pyarrow is not installed in this kernel's environment (`%pip install pyarrow` installs it)"
        else:
            try:
                frame.to_parquet(out)
                return _done(name, f"{name}.parquet", "dataframe", out,
                             f"{what} `{name}`, {shape}; load it with pd.read_parquet('{name}.parquet')")
            except Exception as e:  # columns pyarrow cannot store (mixed objects): a pickle keeps everything
                why = f"pyarrow cannot store it ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
        out.seek(0)
        out.truncate()
        frame.to_pickle(out)
        return _done(name, f"{name}.pkl", "dataframe", out,
                     f"{what} `{name}`, {shape}; load it with pd.read_pickle('{name}.pkl')",
                     f"sent as a pickle, not Parquet: {why}")
    if kind_of == ("numpy", "ndarray") and value.dtype != object:
        import numpy as np

        np.save(out, value, allow_pickle=False)
        return _done(name, f"{name}.npy", "array", out,
                     f"numpy array `{name}`, shape {value.shape}, dtype {value.dtype}; load it with np.load('{name}.npy')")
    if isinstance(value, str):
        out.write(value.encode("utf-8", "surrogatepass"))
        return _done(name, f"{name}.txt", "text", out, f"text `{name}`, {len(value)} characters; open('{name}.txt').read()")
    if isinstance(value, (bytes, bytearray, memoryview)):
        out.write(bytes(value))
        return _done(name, f"{name}.bin", "file", out, f"bytes `{name}`; open('{name}.bin', 'rb').read()")
    if (value is None or isinstance(value, (bool, int, float, dict, list))) and _finite_json(value):
        out.write(json.dumps(value, allow_nan=False).encode())
        return _done(name, f"{name}.json", "json", out, f"JSON value `{name}`; json.load(open('{name}.json'))")
    import pickle

    try:
        pickle.dump(value, out, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise WorkbenchError(f"cannot copy {name!r} ({type(value).__name__}): it cannot be pickled ({e})") from None
    return _done(name, f"{name}.pkl", "pickle", out,
                 f"{type(value).__name__} `{name}` (a pickle); pickle.load(open('{name}.pkl', 'rb'))")


def pack_file(path: str) -> Packed:
    """A file of the notebook's machine, under its own name (opened here; closed after the upload)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed by the caller)
        size = os.fstat(fh.fileno()).st_size
    except OSError as e:
        raise WorkbenchError(f"cannot read {path!r}: {e.strerror or e}") from None
    name = os.path.basename(os.path.normpath(path))
    return Packed(name, name, "file", fh, size, f"file `{name}` ({size:,} bytes)")


def note(records: list[dict[str, Any]]) -> str:
    """What the agent reads before the person's text: what was put in its workspace (attach()'s records)."""
    lines = [f"- `{r['path']}`: {r.get('note') or r.get('kind', 'file')}" for r in records]
    return "[Files attached to your workspace (your current directory) for this message:\n" + "\n".join(lines) + "]\n\n"


def loads(path: str, data: bytes, *, allow_pickle: bool = False) -> Any:
    """A fetched file as a Python value, by its extension (see the module's docstring)."""
    ext = PurePosixPath(path).suffix.lower()
    if ext == ".parquet":
        import pandas as pd

        return pd.read_parquet(io.BytesIO(data))
    if ext in (".csv", ".tsv"):
        import pandas as pd

        return pd.read_csv(io.BytesIO(data), sep="\t" if ext == ".tsv" else ",")
    if ext in (".npy", ".npz"):
        import numpy as np

        try:
            loaded = np.load(io.BytesIO(data), allow_pickle=allow_pickle)
        except ValueError as e:
            raise WorkbenchError(f"{path!r} holds Python objects (a pickle); load(..., allow_pickle=True) "
                                 f"if you trust the agent's code that wrote it ({e})") from None
        return dict(loaded) if ext == ".npz" else loaded
    if ext == ".json":
        return json.loads(data)
    if ext in IMAGE_EXTENSIONS or ext == ".svg":
        from IPython.display import SVG, Image

        return SVG(data=data) if ext == ".svg" else Image(data=data)
    if ext in (".pkl", ".pickle"):
        if not allow_pickle:
            raise WorkbenchError(f"{path!r} is a pickle: loading it runs code that the agent's code chose, in your "
                                 "kernel; load(..., allow_pickle=True) if you trust it, or get() its bytes")
        import pickle

        return pickle.loads(data)  # noqa: S301 (asked for)
    if ext in TEXT_EXTENSIONS or not ext:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data
    return data

