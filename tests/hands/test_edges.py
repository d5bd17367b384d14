"""The hands' edges with hostile input: what a kernel process writes to its fds, a model's timeout, a session's config."""

from __future__ import annotations

import asyncio
import json
import math
import sys

import pytest
from jupyter_client.kernelspec import KernelSpec

from workbench.errors import ConfigError
from workbench.hands import HandsConfig, KernelHands, LocalLauncher
from workbench.hands.factory import hands_config
from workbench.hands.isolating.bubblewrap import KERNEL_MAIN
from workbench.hands.launching.local import without_debugger
from workbench.hands.launching.output import OutputTail
from workbench.hands.observing.kernel_cap import DRAIN_MARK


@pytest.mark.asyncio
async def test_a_kernel_that_cannot_start_says_why_in_one_line(tmp_path):
    spec = tmp_path / "kernels" / "broken"
    spec.mkdir(parents=True)
    # writes to its stderr (with escape sequences, a bell and bytes that are not UTF-8), then exits
    code = "import os; os.write(2, b'loading...\\n\\x1b[31mboom\\x07: no module named \\xff\\xfekernel\\x1b[0m\\n'); os._exit(3)"
    spec.joinpath("kernel.json").write_text(json.dumps({"argv": [sys.executable, "-c", code, "{connection_file}"],
                                                        "display_name": "broken", "language": "python"}))
    hands = KernelHands(HandsConfig(startup_timeout=30),
                        launcher=LocalLauncher(kernel_name="broken", spec_dirs=[str(tmp_path / "kernels")]))
    async with hands:
        obs = await hands.execute("1")
    assert obs.error["ename"] == "KernelStartError"
    message = obs.error["evalue"]
    assert "its last output: boom: no module named \ufffd\ufffdkernel" in message, message
    assert "\n" not in message and "\x1b" not in message and "\x07" not in message


@pytest.mark.asyncio
async def test_a_flood_on_the_kernels_own_descriptors_is_drained_and_capped():
    async with KernelHands(HandsConfig(timeout=60)) as hands:
        # below ipykernel's capture: the process's real stderr, the pipe the hands read
        obs = await hands.execute("import os, sys\nfd = sys.stderr._original_stdstream_copy\n"
                                  "for _ in range(160): os.write(fd, b'\\xff' + b'y' * 65535)\n'done'")
        assert obs.result == "'done'", obs.to_json()  # the kernel never blocked on a full pipe
        tail = hands.kernel.output
        assert tail.written["stderr"] >= 160 * 65536
        assert len(tail.kept["stderr"]) == tail.limit
        assert tail.text("stderr").endswith("y" * 1000) and "\ufffd" in tail.text("stderr")
        mark = tail.written["stderr"]
        await hands.execute("import os\nos.write(fd, b'after the mark')")
        assert tail.since("stderr", mark) == "after the mark"


@pytest.mark.asyncio
async def test_a_local_kernel_of_ipykernels_own_spec_starts_without_a_debugger_and_its_code_can_import_one():
    """As in the sandbox (bubblewrap.KERNEL_MAIN): debugpy is a quarter of a kernel's start, and nobody debugs the
    hands; the model's code imports it all the same. A kernelspec with a main of its own is started as it says."""
    async with KernelHands(HandsConfig(timeout=60)) as hands:
        obs = await hands.execute("import json, sys\nimport ipykernel.debugger as d\nbefore = 'debugpy' in sys.modules\n"
                                  "import debugpy\njson.dumps([before, d._is_debugpy_available, bool(debugpy.__file__)])")
    assert obs.result == "'[false, false, true]'", obs.to_json()
    own = KernelSpec(argv=[sys.executable, "-m", "my_kernel", "-f", "{connection_file}"], display_name="x", language="python")
    assert without_debugger(own) is own
    usual = KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"], display_name="x",
                       language="python")
    assert without_debugger(usual).argv == [sys.executable, "-c", KERNEL_MAIN, "-f", "{connection_file}"]


def test_the_kernels_drain_mark_is_taken_out_of_its_output_even_when_it_comes_in_two_reads():
    mark = DRAIN_MARK.encode()
    tail = OutputTail(limit=64)
    tail.add("stderr", b"before " + mark[:5])
    tail.add("stderr", mark[5:] + b"after\x00" + mark)
    tail.add("stdout", b"\x00 a NUL of the kernel's own")
    assert tail.text("stderr") == "before after\x00" and tail.written["stderr"] == len("before after\x00")
    assert tail.since("stderr", 7) == "after\x00"
    assert tail.text("stdout") == "\x00 a NUL of the kernel's own"


@pytest.mark.asyncio
async def test_a_timeout_the_model_asks_for_that_is_not_a_positive_finite_number_means_the_default():
    async with KernelHands(HandsConfig(timeout=0.5, interrupt_grace=5)) as hands:
        await hands.execute("1")
        for asked in (math.nan, math.inf, -5, True, "10"):
            # the guard is for the failure: a NaN deadline never passes, and the call would run forever
            obs = await asyncio.wait_for(hands.execute("while True: pass", timeout=asked), 60)
            assert obs.error["ename"] == "KeyboardInterrupt" and "timed out after 0.5 s" in obs.text(), (asked, obs.text())
    capped = KernelHands(HandsConfig(timeout=7, max_timeout=30))
    assert (capped._timeout(10**9), capped._timeout(2.5), capped._timeout(None)) == (30, 2.5, 7)


@pytest.mark.parametrize("hands", [
    "x", ["timeout"], {"timeout": "60"}, {"timeout": math.nan}, {"timeout": -1}, {"timeout": True},
    {"output_limit": 1.5}, {"output_limit": math.inf}, {"workdir": 3}, {"workdir": "a\0b"}, {"workdir": ""},
    {"env": {"A": 1}}, {"env": {"A=B": "c"}}, {"env": ["A"]}, {"env": {"A": "b\0c"}}, {"replay": "yes"},
    {"colour": "red"}, {"\ud800": 1},
], ids=repr)
def test_hostile_session_hands_settings_are_refused_in_one_line(hands):
    with pytest.raises(ConfigError) as e:
        hands_config({"hands": hands})
    assert "\n" not in str(e.value)


def test_good_session_hands_settings_pass():
    c = hands_config({"hands": {"timeout": 5, "output_limit": 100, "workdir": "/tmp/x", "env": {"A": "b"}, "replay": True}})
    assert (c.timeout, c.output_limit, c.workdir, c.env, c.replay) == (5, 100, "/tmp/x", {"A": "b"}, True)
    assert hands_config(None) == HandsConfig() == hands_config({"hands": None})
