"""The test servers' own start: a port taken between its choice and the server's bind is not a failed test.

A JupyterProcess picks a free port when it is made and the server binds it seconds later; on a loaded machine
running four workers, another process took it in between once (CI: a worker's JupyterLab exited with "port ...
is not available", and every browser test of that worker errored at setup).
"""

from __future__ import annotations

import socket

from workbench.testing import JupyterProcess


def test_a_server_whose_port_was_taken_starts_on_another(tmp_path):
    server = JupyterProcess(tmp_path / "home", extensions={"workbench": True}, env={"WORKBENCH_DB": str(tmp_path / "wb.duckdb")})
    chosen = server.port
    with socket.socket() as squatter:  # someone else listens on the chosen port before the server starts
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", chosen))
        squatter.listen()
        try:
            server.start(timeout=120)
            assert server.port != chosen and server.url.endswith(f":{server.port}")
            assert "could not be started because port" in server.log_tail(100_000)
        finally:
            server.stop()
