"""Fixtures of the chat-page tests: `conductor serve` on loopback, headless Chromium, and
the folder the screenshots go to (target/browser-test/)."""

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHOTS = ROOT / "target" / "browser-test"
# Every wait is bounded: the longest is the server's start (fetching the default model).
START_TIMEOUT = 180


class Server:
    """`conductor serve` on a free loopback port with the default model, killed at the end."""

    def __init__(self, *flags):
        binary = os.environ.get("CONDUCTOR_BIN", str(ROOT / "target/checked/conductor"))
        self.proc = subprocess.Popen(
            [binary, "serve", "--host", "127.0.0.1", "--port", "0", "-t", "1", *flags],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log = []
        threading.Thread(target=self._drain, daemon=True).start()
        lines = []
        reader = threading.Thread(target=lambda: lines.append(self.proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(START_TIMEOUT)
        line = lines[0].strip() if lines else ""
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"conductor serve did not start ({line!r}); log:\n{self.logged()}")
        self.url = line.removeprefix("listening on ")

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def logged(self):
        return "".join(self.log)

    def stop(self):
        self.proc.kill()
        self.proc.wait(10)

    def get(self, path, key=None):
        request = urllib.request.Request(self.url + path)
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.read().decode()

    def post(self, path, body, key=None):
        request = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        with urllib.request.urlopen(request, timeout=120) as r:
            return json.loads(r.read())

    def metric(self, name, key=None):
        for line in self.get("/metrics", key).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise AssertionError(f"{name} is not in /metrics")


def make_browser(data_dir):
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1100,760",
        f"--user-data-dir={data_dir}",
    ]:
        options.add_argument(flag)
    service = Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    return driver


@pytest.fixture(scope="session")
def shots():
    SHOTS.mkdir(parents=True, exist_ok=True)
    return SHOTS


@pytest.fixture(scope="module")
def server():
    s = Server("-c", "1024")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def browser():
    with tempfile.TemporaryDirectory(prefix="conductor-chromium-") as data_dir:
        driver = make_browser(data_dir)
        yield driver
        driver.quit()


def wait_for(what, check, timeout=60, every=0.05):
    """Polls `check()` until it returns a true value (returned), failing after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)
