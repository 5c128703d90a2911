"""The README's first command, `bash scripts/lab.sh`, opens JupyterLab: as root (a container,
a cloud notebook VM) as well as a normal user, whichever this test runs as, saying each step
of its set-up as it goes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(600)
def test_lab_script_starts_jupyterlab_as_this_user(tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "NEURON_LAB_SKIP_CHROMIUM": "1"}
    log = (tmp_path / "lab.log").open("w")
    lab = subprocess.Popen(
        ["bash", "scripts/lab.sh", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         "--ServerApp.token=", "--ServerApp.port_retries=0"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 540
        status = None
        while time.monotonic() < deadline and lab.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab/api/settings", timeout=5) as r:
                    status = r.status, json.load(r)
                    break
            except OSError:
                time.sleep(1)
        output = (tmp_path / "lab.log").read_text()
        assert lab.poll() is None, f"lab.sh exited with {lab.returncode} (as uid {os.getuid()}):\n{output[-3000:]}"
        assert status is not None and status[0] == 200, output[-3000:]
        assert "settings" in status[1]
        assert "Running as root is not recommended" not in output
        # The set-up says each step as it goes, with its time, and nothing else from pip.
        for step in range(1, 7):
            assert f"setup [{step}/6] " in output, output[-3000:]
        assert "setup: ready in" in output and "lab: starting JupyterLab" in output, output[-3000:]
        assert "WARNING: Running pip as the 'root' user" not in output, output[-3000:]
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        try:
            lab.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(lab.pid, signal.SIGKILL)
        log.close()
