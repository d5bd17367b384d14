"""The gateway backend against Jupyter Enterprise Gateway's REST and websocket API.

Enterprise Gateway 3.3 pins jupyter_server < 2 and jupyter_client < 7, which the workbench's own
environment cannot hold, so it runs from an environment of its own: set WORKBENCH_TEST_ENTERPRISE_GATEWAY
to its `jupyter-enterprisegateway` (e.g. after `python3 -m venv eg && eg/bin/pip install
jupyter-enterprise-gateway==3.3.0 ipykernel`). Without it these tests are skipped, and say why.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import urllib.request

import psutil
import pytest

from workbench.hands.factory import HandsFactory, HandsSettings

from .conftest import free_port

EG = os.environ.get("WORKBENCH_TEST_ENTERPRISE_GATEWAY", "")
TOKEN = "test-eg-token"
pytestmark = pytest.mark.skipif(not EG, reason="Enterprise Gateway needs an environment of its own (it pins jupyter_server < 2 "
                                               "and jupyter_client < 7): set WORKBENCH_TEST_ENTERPRISE_GATEWAY to its binary")


@pytest.fixture(scope="module")
def enterprise_gateway(hands_tmp):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "WORKBENCH_"))}
    env.update(JUPYTER_RUNTIME_DIR=str(hands_tmp / "eg-runtime"), PATH=os.path.dirname(EG) + os.pathsep + env.get("PATH", ""))
    cmd = [EG, "--ip=127.0.0.1", f"--port={port}", "--port_retries=0", f"--EnterpriseGatewayApp.auth_token={TOKEN}",
           "--EnterpriseGatewayApp.unauthorized_users=['nobody']"]  # root may start kernels here (tests run as root)
    proc = subprocess.Popen(cmd, cwd=hands_tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(url + "/api", headers={"Authorization": f"token {TOKEN}"}),
                                       timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, "Enterprise Gateway exited"
                assert time.monotonic() < deadline, "Enterprise Gateway did not answer within 120 s"
                time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.asyncio
async def test_hands_on_enterprise_gateway_with_the_pool(enterprise_gateway, tmp_path, recorder):
    url, pid = enterprise_gateway
    events, sink = recorder
    s = HandsSettings(backend="gateway", gateway_url=url, gateway_token=TOKEN, pool_size=1, registry_dir=str(tmp_path / "r"))
    async with HandsFactory(s) as factory:
        hands = factory("eg", {"hands": {"timeout": 5, "interrupt_grace": 1, "startup_timeout": 120}}, sink)
        obs = await hands.execute("x = 41\nprint('hi')")
        assert obs.ok and obs.stdout == "hi\n", obs.text()
        assert (await hands.execute("x + 1")).result == "42"
        obs = await hands.execute("import time; time.sleep(60)")
        assert obs.error and obs.error["ename"] == "KeyboardInterrupt" and "timed out" in obs.text()
        limits = next(p for t, p in events if t == "hands_started")["limits"]
        assert limits["open_files"].startswith("rlimit 1024, set in the kernel")
        kid = hands.status()["kernel_id"]
        kpid = next(c.pid for c in psutil.Process(pid).children(recursive=True) if any(kid in a for a in c.cmdline()))
        kernel = hands.kernel
        os.kill(kpid, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while await kernel.death() is None:
            assert time.monotonic() < deadline, "the dead kernel was not noticed"
            await asyncio.sleep(0.05)
        assert (await hands.execute("1+1", timeout=60)).result == "2"
        assert [p["pooled"] for t, p in events if t == "hands_started"] == [True, True]
        await hands.shutdown()
        assert hands.status()["state"] == "stopped"
