"""Browsers against the Videos API, in headless Chromium (Debian's chromium + chromium-driver through
Selenium) with a real tritonserver: a page on another origin (a second local HTTP server) using the
official openai JS SDK (npm `openai`, bundled with esbuild: tests/js/, installed by scripts/setup.sh)
creates, polls and downloads a video through CORS; the page itself with a Cyrillic or an emoji key
lists that key's jobs. One front end serves both tests."""

import functools
import hashlib
import http.server
import shutil
import subprocess
import threading

import pytest
from selenium.webdriver.common.by import By

from server.environment import pick_free_ports
from videos_api.auth import owner_of
from videos_api.fields import parse_create
from videos_api.store import Store

from .serving import ROOT
from .test_videos_page import chromium
from .videos_api_serving import API_KEY, HTTP, FrontEnd, wait_for

JS = ROOT / "tests" / "js"
ESBUILD = JS / "node_modules" / ".bin" / "esbuild"
NON_LATIN1_KEYS = ("ключ", "🔑")  # a browser cannot put either in a header as it is
STEPS = 200  # enough steps for the SDK's polls to see the job active before it completes
PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>another origin</title><script src="bundle.js"></script></head>
<body>a page on another origin</body></html>
"""


@pytest.fixture(scope="module")
def origin(tmp_path_factory):
    """A second origin: a static HTTP server on another free port serving a page with the SDK
    bundled (tests/js/sdk_probe.js as the global `sdkProbe`). Fails, naming the install, when
    tests/js/node_modules is missing: the test never skips."""
    if not ESBUILD.exists() or not (JS / "node_modules" / "openai" / "package.json").exists():
        pytest.fail(
            "the cross-origin JS SDK test needs tests/js/node_modules (npm openai, esbuild): run `make setup` "
            "(scripts/setup.sh runs `npm ci` in tests/js; Debian: apt-get install nodejs npm)"
        )
    site = tmp_path_factory.mktemp("origin")
    subprocess.run(
        [
            str(ESBUILD),
            "sdk_probe.js",
            "--bundle",
            "--format=iife",
            "--global-name=sdkProbe",
            "--platform=browser",
            f"--outfile={site / 'bundle.js'}",
            "--log-level=warning",
        ],
        cwd=JS,
        check=True,
    )
    (site / "index.html").write_text(PAGE, encoding="utf-8")
    (port,) = pick_free_ports(1, "127.0.0.1")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as httpd:
        thread = threading.Thread(target=httpd.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{port}"
        httpd.shutdown()


@pytest.fixture(scope="module")
def front_end(server, origin, tmp_path_factory):
    """The front end allowing `origin` (CORS), with API_KEY and NON_LATIN1_KEYS, each of the latter
    owning one ended job stored before it started (`video_<key's owner prefix>`)."""
    data = tmp_path_factory.mktemp("browser_front_end")
    store = Store(data / "jobs.sqlite3")
    request, _ = parse_create({"prompt": "mine", "seed": 1}, "h3")
    for key in NON_LATIN1_KEYS:
        store.add(f"video_{owner_of(key.encode())[:12]}", 1000, request, owner_of(key.encode()))
        store.end(f"video_{owner_of(key.encode())[:12]}", "failed", 1000, 2**40, error=("INTERNAL", "INTERNAL: x"))
    store.close()
    keys = "".join(f"{key}\n" for key in (API_KEY, *NON_LATIN1_KEYS))
    with FrontEnd(server.grpc_url, data, "--cors-origin", origin, keys=keys) as started:
        yield started


@pytest.fixture(scope="module")
def browser():
    driver = chromium()
    driver.set_script_timeout(300)
    yield driver
    driver.quit()


def test_the_js_sdk_on_another_origin_creates_polls_and_downloads_a_video(front_end, origin, browser):
    assert shutil.which("node"), "node is needed for esbuild: run `make setup`"
    browser.get(f"{origin}/")
    body = {"prompt": "a red ball rolls to the left", "size": "96x64", "num_frames": 9, "seed": 3}
    body["num_inference_steps"] = STEPS
    result = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        " sdkProbe.run(arguments[0], arguments[1], arguments[2]).then(done, (e) => done({error: String(e)}));",
        f"{front_end.url}/v1",
        API_KEY,
        body,
    )
    assert "error" not in result, result
    mp4 = HTTP.get(
        f"{front_end.url}/v1/videos/{result['id']}/content", headers={"Authorization": f"Bearer {API_KEY}"}
    ).content
    size = len(mp4)
    assert result["statuses"][-1] == "completed" and set(result["statuses"]) <= {"queued", "in_progress", "completed"}
    assert result["pollAfter"] == ["500"]  # read through CORS (exposed) while the job was active
    # 9 frames asked for, served aligned up to 22 (17n+5): 22 / 24 s once completed
    assert (result["size"], result["seconds"]) == ("96x64", "0.917")
    assert (result["mp4Bytes"], result["mp4Sha256"]) == (size, hashlib.sha256(mp4).hexdigest())
    assert (result["tailStatus"], result["tailRange"], result["tailSha256"]) == (
        206,
        f"bytes {size - 100}-{size - 1}/{size}",
        hashlib.sha256(mp4[-100:]).hexdigest(),
    )
    assert result["listedIds"][0] == result["id"]


def test_the_page_with_a_cyrillic_or_emoji_key_lists_its_own_jobs(front_end, browser):
    browser.get(f"{front_end.url}/")
    for key in NON_LATIN1_KEYS:
        # chromedriver types no emoji (outside the BMP): the key is set as a paste would, then changed
        browser.execute_script(
            "const input = document.getElementById('api-key'); input.value = arguments[0];"
            " input.dispatchEvent(new Event('change'));",
            key,
        )

        def rows(expected: list[str]) -> list[str] | None:
            ids = browser.execute_script(
                "return Array.from(document.querySelectorAll('#jobs tr'), (row) => row.dataset.id)"
            )
            return ids if ids == expected else None

        wait_for(lambda: rows([f"video_{owner_of(key.encode())[:12]}"]), 30, f"the jobs of key {key!r} listed")  # noqa: B023
        assert not browser.find_element(By.ID, "error").is_displayed()
