"""The environment a data scientist expects inside the sandbox: a shell, UTF-8, parallel loops, `%pip`.

The sandbox takes away the host (its files, its network, its processes); it should not take away
what notebooks rely on: `!` lines run under bash, multiprocessing and joblib work (they need a
writable /dev/shm, see test_isolation), output written below Python reaches the call's output, and
`%pip install` puts packages in the session's own folder, or says plainly that the network is closed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import zipfile

import pytest

from .conftest import run

pytestmark = pytest.mark.asyncio


async def test_shell_and_language_variables(make_hands):
    hands, _ = await make_hands()
    out = json.loads(await run(hands, "import json, os\nprint(json.dumps({k: os.environ.get(k) for k in "
                                      "('SHELL', 'LANG', 'HOME', 'MPLBACKEND')}))"))
    assert out["SHELL"] == "/bin/bash" and out["LANG"] and out["HOME"] and "inline" in out["MPLBACKEND"]
    assert (await run(hands, "!echo {a,b}; set -o pipefail && echo piped")).split() == ["a", "b", "piped"]


async def test_the_kernel_starts_without_a_debugger_and_the_models_code_can_import_one(make_hands):
    """The sandbox's kernel main (bubblewrap.KERNEL_MAIN) skips debugpy at start, as a kernel nobody debugs may; the
    model's code can import it all the same."""
    hands, _ = await make_hands()
    out = json.loads(await run(hands, "import json, sys\nimport ipykernel.debugger as d\n"
                                      "before = 'debugpy' in sys.modules\nimport debugpy\n"
                                      "print(json.dumps({'before': before, 'available': d._is_debugpy_available, "
                                      "'imported': bool(debugpy.__file__)}))"))
    assert out["before"] is False and out["available"] is False and out["imported"] is True, out


async def test_pool_map_and_joblib_run_in_parallel_processes(make_hands):
    hands, _ = await make_hands()
    code = ("import json, multiprocessing as mp, os\nfrom joblib import Parallel, delayed\n"
            "with mp.Pool(2) as p:\n    pool = p.map(abs, [-1, -2, -3])\n"
            "jobs = Parallel(n_jobs=2)(delayed(abs)(i) for i in [-4, -5, -6])\n"
            "workers = set(Parallel(n_jobs=2)(delayed(os.getpid)() for _ in range(8)))\n"
            "print(json.dumps({'pool': pool, 'jobs': jobs, 'other': os.getpid() not in workers}))")
    assert json.loads(await run(hands, code)) == {"pool": [1, 2, 3], "jobs": [4, 5, 6], "other": True}


async def test_output_below_python_reaches_the_call(make_hands):
    hands, _ = await make_hands()
    obs = await hands.execute("import ctypes, os\nos.system('echo from-a-shell')\n"
                              "line = b'from-c-code\\n'\nctypes.CDLL(None).write(2, line, len(line))", timeout=30)
    assert obs.ok and "from-a-shell" in obs.stdout and "from-c-code" in obs.stderr, obs.to_json()


def wheel(name: str, version: str) -> bytes:
    """A pure-Python wheel of one module `name` (value = 42), made here: no network, no build backend."""
    import io

    dist = f"{name}-{version}.dist-info"
    files = {f"{name}.py": b"value = 42\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}\n"
                     for p, d in files.items()) + f"{dist}/RECORD,,\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for p, d in files.items():
            z.writestr(p, d)
        z.writestr(f"{dist}/RECORD", record)
    return buf.getvalue()


async def test_pip_installs_into_the_sessions_own_folder(make_hands):
    hands, _ = await make_hands()
    whl = wheel("wbtestpkg", "1.0")
    data = base64.b64encode(whl).decode()
    await run(hands, f"import base64\nopen('wbtestpkg-1.0-py3-none-any.whl', 'wb').write(base64.b64decode({data!r}))")
    text = await run(hands, "%pip install --no-index ./wbtestpkg-1.0-py3-none-any.whl")
    assert "Successfully installed wbtestpkg-1.0" in text and "this session's own package folder" in text, text
    out = json.loads(await run(hands, "import json, os, wbtestpkg\n"
                                      "print(json.dumps([wbtestpkg.value, os.path.relpath(wbtestpkg.__file__)]))"))
    assert out == [42, ".packages/wbtestpkg.py"]


async def test_pip_says_plainly_when_the_egress_policy_closes_the_index(make_hands):
    hands, _ = await make_hands()  # the default policy: no host allowed
    obs = await hands.execute("%pip install --no-cache-dir --index-url https://packages.example.invalid/simple/ wbnothing",
                              timeout=120)
    text = obs.text()
    assert "could not reach the package index" in text and "egress" in text, text
