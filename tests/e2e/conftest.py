"""Fixtures for the real-browser end-to-end tests: a private JupyterLab server on a free
loopback port and a headless Chromium (Debian's package) driven by Playwright.

Nothing here touches the user's Jupyter configuration: config, data, runtime, settings,
workspaces and IPython directories all live in a temporary folder, and the only kernel the
server offers is this interpreter (``sys.executable``). Everything is torn down in
``finally`` blocks, and the server's log, the browser's console and a screenshot land in the
artifacts folder (``test-artifacts/e2e`` at the repository root, or
``$NEURON_LAB_TEST_ARTIFACTS``).

Where Chromium or Playwright is missing the tests skip locally with the fix in the reason,
but fail under CI (``CI`` set): there ``scripts/setup.sh`` installs both.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_START_TIMEOUT_S = 90.0
KERNEL_NAME = "neuron-lab-e2e"
KERNEL_DISPLAY_NAME = "Python 3 (neuron_lab)"
# Debian's /usr/bin/chromium is a shell wrapper around this binary; the binary itself
# is what Playwright should launch (the wrapper only adds flags from /etc/chromium.d).
CHROMIUM_CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser")


def _unavailable(reason: str):
    """Skips locally; fails in CI, where the set-up is supposed to provide everything."""
    if os.environ.get("CI"):
        pytest.fail(f"end-to-end browser test cannot run in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def find_chromium() -> str | None:
    override = os.environ.get("NEURON_LAB_CHROMIUM")
    if override:  # exactly this one, or none
        return override if os.access(override, os.X_OK) else None
    for candidate in CHROMIUM_CANDIDATES:
        path = candidate if os.path.isabs(candidate) else shutil.which(candidate)
        if path and os.access(path, os.X_OK):
            return path
    return None


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    root = Path(os.environ.get("NEURON_LAB_TEST_ARTIFACTS", REPO_ROOT / "test-artifacts"))
    path = root / "e2e"
    shutil.rmtree(path, ignore_errors=True)  # no stale pictures from an earlier run
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def chromium_executable() -> str:
    path = find_chromium()
    if path is None:
        override = os.environ.get("NEURON_LAB_CHROMIUM")
        _unavailable(
            (f"NEURON_LAB_CHROMIUM={override} is not an executable; " if override else
             "Chromium not found (looked for /usr/lib/chromium/chromium, chromium, "
             "chromium-browser; NEURON_LAB_CHROMIUM names another); ")
            + "install it with "
            "`apt-get install -y --no-install-recommends chromium` or run scripts/setup.sh"
        )
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


@dataclass
class JupyterServer:
    base_url: str
    token: str
    root_dir: Path
    log_path: Path
    # What a notebook's metadata names to get this interpreter as its kernel.
    kernelspec = {"name": KERNEL_NAME, "display_name": KERNEL_DISPLAY_NAME, "language": "python"}

    def url(self, path: str) -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base_url}/{path.lstrip('/')}{sep}token={self.token}"

    def notebook_url(self, notebook: str) -> str:
        """Opens ``notebook`` alone: ``?reset`` empties the workspace first, so that the
        notebooks an earlier test opened in this server do not come back beside it."""
        return self.url(f"lab/tree/{notebook}?reset")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "<no server log>"


def _private_jupyter_env(home: Path) -> dict[str, str]:
    """Environment for a server that sees no user or site configuration of its own: every
    per-user Jupyter/IPython directory points into ``home``; the venv's own data (the
    widgets' lab extension, server extension switches) stays visible through sys.prefix."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("JUPYTER", "IPYTHON")) and key != "PYTHONSTARTUP"
    }
    dirs = {
        "JUPYTER_CONFIG_DIR": home / "config",
        "JUPYTER_DATA_DIR": home / "data",
        "JUPYTER_RUNTIME_DIR": home / "runtime",
        "JUPYTERLAB_SETTINGS_DIR": home / "lab-settings",
        "JUPYTERLAB_WORKSPACES_DIR": home / "lab-workspaces",
        "IPYTHONDIR": home / "ipython",
    }
    for key, path in dirs.items():
        path.mkdir(parents=True, exist_ok=True)
        env[key] = str(path)
    env["JUPYTER_PLATFORM_DIRS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _configure(home: Path) -> None:
    # The notebook's kernel: this interpreter, under a name no other spec has (in a venv,
    # jupyter_core searches sys.prefix before the user data dir).
    _write_json(
        home / "data" / "kernels" / KERNEL_NAME / "kernel.json",
        {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": KERNEL_DISPLAY_NAME,
            "language": "python",
            "metadata": {"debugger": False},
        },
    )
    settings = home / "lab-settings"
    # No news/update toasts over the screenshots.
    _write_json(
        settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
        {"fetchNews": "false", "checkForUpdates": False},
    )
    # Every cell in the DOM, laid out (no virtual scrolling), so that selectors and
    # element screenshots see outputs below the fold; no blank space after the last cell.
    _write_json(
        settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings",
        {"windowingMode": "none", "scrollPastEnd": False},
    )


def _get(url: str, timeout: float = 2.0) -> int:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback)
        return response.status


def _stop_process_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)  # the server's own group: it and the kernels it started
    except ProcessLookupError:
        pass


@pytest.fixture(scope="session")
def jupyter_server(tmp_path_factory, artifacts_dir) -> JupyterServer:
    home = tmp_path_factory.mktemp("jupyter-home")
    root_dir = tmp_path_factory.mktemp("notebooks")
    _configure(home)
    env = _private_jupyter_env(home)
    log_path = artifacts_dir / "jupyter-server.log"
    token = secrets.token_hex(24)

    proc = None
    log = open(log_path, "w")
    try:
        for _attempt in range(3):  # another process may grab the free port in between
            port = _free_port()
            cmd = [
                sys.executable, "-m", "jupyter", "lab",
                "--no-browser",
                "--allow-root",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root_dir}",
                "--ServerApp.terminals_enabled=False",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.expose_app_in_browser=True",
                "--LanguageServerManager.autodetect=False",
            ]
            log.write(f"$ {' '.join(cmd)}\n")
            log.flush()
            proc = subprocess.Popen(
                cmd, env=env, cwd=root_dir, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
            base_url = f"http://127.0.0.1:{port}"
            server = JupyterServer(base_url, token, root_dir, log_path)
            deadline = time.monotonic() + SERVER_START_TIMEOUT_S
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if _get(server.url("api/status")) == 200:
                        break
                except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                    pass
                time.sleep(0.25)
            else:
                if proc.poll() is not None and "already in use" in server.log_tail():
                    continue
                pytest.fail(
                    f"JupyterLab did not become ready within {SERVER_START_TIMEOUT_S:.0f}s "
                    f"(exit code {proc.poll()}); server log tail:\n{server.log_tail()}",
                    pytrace=False,
                )
            break
        else:
            pytest.fail(f"JupyterLab could not bind a free port; log:\n{server.log_tail()}")
        yield server
    finally:
        if proc is not None and proc.poll() is None:
            try:  # a clean shutdown stops the kernels too
                req = urllib.request.Request(
                    f"{base_url}/api/shutdown", method="POST",
                    headers={"Authorization": f"token {token}"},
                )
                urllib.request.urlopen(req, timeout=5).close()  # noqa: S310 (loopback)
                proc.wait(timeout=10)
            except Exception:  # noqa: BLE001 (fall through to signals)
                pass
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if proc.poll() is not None:
                    break
                _stop_process_group(proc, sig)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        if proc is not None:
            # Kernels outlive a server killed by signal: end the rest of its group.
            _stop_process_group(proc, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="session")
def browser(chromium_executable):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable(
            "the Python package playwright is not installed; "
            "install the test extras (`pip install -e '.[test]'`) or run scripts/setup.sh"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_executable,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
            timeout=60_000,
        )
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser, artifacts_dir, request):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda msg: console.append(f"[{msg.type}] {msg.text}"))
    page.on("pageerror", lambda exc: console.append(f"[pageerror] {exc}"))
    try:
        yield page
    finally:
        name = request.node.name
        (artifacts_dir / f"{name}.console.log").write_text("\n".join(console) + "\n")
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            try:
                page.screenshot(path=str(artifacts_dir / f"{name}.failure.png"))
                (artifacts_dir / f"{name}.failure.html").write_text(page.content())
            except Exception:  # noqa: BLE001 (best effort on a broken page)
                pass
        context.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Lets the page fixture see whether the test body failed (for failure screenshots)."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)
