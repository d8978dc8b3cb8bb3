"""The Videos API's page in a real headless Chromium (Debian's chromium + chromium-driver through
Selenium) against a real tritonserver: the API key, a prompt with a first frame picked submitted,
progress advancing, previews, the video element loading the clip beside the first frame, the job
list with its task; then a front end killed mid-job and started again, the page reconnecting by
itself. The screenshots are kept in out/test_videos_page/ (page.png, reconnecting.png,
reconnected.png)."""

import shutil
import time

import openai
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from .serving import ROOT
from .test_fl2va_serving import png
from .videos_api_serving import API_KEY, FrontEnd, wait_for

SCREENSHOT = ROOT / "out" / "test_videos_page" / "page.png"
STEPS = 200  # enough steps for the page's polls (every 250 ms) to see the job between 0 and 100 %


def chromium() -> webdriver.Chrome:
    """Headless Debian chromium through its chromedriver; the test fails, naming the install, without them."""
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (binary and driver):
        pytest.fail(
            "the page test needs Debian's chromium and chromium-driver: run `make setup` "
            "(or `apt-get install chromium chromium-driver`)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1100,1000"):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(driver))


def open_with_key(browser: webdriver.Chrome, url: str):
    """Load the page at `url`, open its settings and enter the tests' API key; returns
    browser.find_element."""
    browser.get(f"{url}/")
    find = browser.find_element
    find(By.TAG_NAME, "summary").click()
    find(By.ID, "api-key").send_keys(API_KEY, Keys.TAB)
    return find


def test_the_page_generates_a_video_from_a_first_frame_with_progress_previews_and_the_clip(server, tmp_path):
    with FrontEnd(server.grpc_url, tmp_path / "data") as front_end:
        browser = chromium()
        try:
            browser.get(f"{front_end.url}/")
            find = browser.find_element
            # without the key the job list is refused, and the page says why
            unauthorized = "UNAUTHORIZED: a valid API key is required: send Authorization: Bearer <key>"
            wait_for(lambda: find(By.ID, "error").text == unauthorized, 30, "the 401 on the page")
            find(By.TAG_NAME, "summary").click()
            find(By.ID, "api-key").send_keys(API_KEY, Keys.TAB)
            wait_for(lambda: not find(By.ID, "error").is_displayed(), 30, "the error cleared")
            prompt = find(By.ID, "prompt")
            prompt.clear()
            prompt_text = "a green ball moves to the right while a high tone plays on the left"
            prompt.send_keys(prompt_text)
            find(By.ID, "size").send_keys("96x64")
            find(By.ID, "steps").send_keys(str(STEPS))
            find(By.ID, "seed").send_keys("5")
            first_frame = tmp_path / "first.png"
            first_frame.write_bytes(png(64, 96, 7))
            find(By.ID, "first-frame").send_keys(str(first_frame))  # the picker's file, as a user picks it
            find(By.ID, "generate").click()

            seen = []  # (progress bar value, preview image width) as the page shows them

            def loaded() -> bool:
                value, preview_width, ready = browser.execute_script(
                    "return [document.getElementById('progress').value,"
                    " document.getElementById('preview').naturalWidth,"
                    " document.getElementById('video').readyState]"
                )
                if not seen or seen[-1] != (value, preview_width):
                    seen.append((value, preview_width))
                return ready >= 2  # HAVE_CURRENT_DATA: the clip is decoded

            wait_for(loaded, 300, "the video element loading the clip")
            values = [value for value, _ in seen]
            assert values == sorted(values) and values[-1] == 100, seen
            assert any(0 < value < 100 for value in values), f"no progress between 0 and 100 %: {seen}"
            assert any(0 < value < 100 and width == 6 for value, width in seen), f"no preview while it ran: {seen}"
            job_id = find(By.ID, "job-id").text
            assert find(By.ID, "task").text == "fl2va"
            shown = wait_for(
                lambda: browser.execute_script(
                    "const i = document.querySelector('#inputs img.input-first_frame');"
                    " return i && i.naturalWidth ? [i.naturalWidth, i.naturalHeight, i.nextSibling.textContent] : null"
                ),
                30,
                "the first frame beside the result",
            )
            assert shown == [96, 64, "first frame"]
            assert find(By.ID, "status").text == f"completed, step {STEPS} of {STEPS} (100 %)"
            assert find(By.ID, "preview-caption").text == f"preview after step {STEPS}"
            video = browser.execute_script(
                "const v = document.getElementById('video'); return [v.videoWidth, v.videoHeight, v.duration]"
            )
            assert video == [96, 64, pytest.approx(22 / 24, abs=0.05)]  # the tiny config's 22 frames at 24 fps

            def row_cells() -> list[str] | None:
                try:
                    return [cell.text for cell in browser.find_elements(By.CSS_SELECTOR, f"tr[data-id='{job_id}'] td")]
                except StaleElementReferenceException:
                    return None  # the list was redrawn while it was read: read it again

            cells = wait_for(row_cells, 30, "the job in the list")
            assert cells[1:] == [prompt_text, "fl2va", "96x64", "0.917", "5", "completed 100 %", "showdelete"]
            # for the screenshot: the clip at its middle frame, once the player has drawn it
            browser.execute_async_script(
                "const [v, done] = [document.getElementById('video'), arguments[0]];"
                " v.addEventListener('seeked', () => requestAnimationFrame(() => done()), {once: true});"
                " v.currentTime = v.duration / 2;"
            )
            time.sleep(1.0)  # Chromium's player fades its loading spinner out after a seek
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            assert browser.save_screenshot(str(SCREENSHOT))
        finally:
            browser.quit()


def test_the_page_reconnects_after_a_front_end_restart_and_the_sdk_resumes_by_id(server, tmp_path):
    """The front end killed mid-job: the page says it is reconnecting, the SDK raises
    APIConnectionError; started again on the same port, the job is resubmitted (the restart
    rule), the page follows it to the clip by itself and the SDK retrieves it by id."""
    front_end = FrontEnd(server.grpc_url, tmp_path / "data").start()
    browser = chromium()
    try:
        find = open_with_key(browser, front_end.url)
        prompt = find(By.ID, "prompt")
        prompt.clear()
        prompt.send_keys("a red ball rolls to the left while a low tone plays on the left")
        find(By.ID, "steps").send_keys("400")
        find(By.ID, "generate").click()
        wait_for(lambda: find(By.ID, "status").text.startswith("in_progress, step "), 120, "the job running")
        job_id = find(By.ID, "job-id").text
        front_end.kill()
        down = "reconnecting: the server cannot be reached ("
        wait_for(lambda: find(By.ID, "status").text.startswith(down), 60, "the page saying it reconnects")
        sdk = openai.OpenAI(base_url=f"{front_end.url}/v1", api_key=API_KEY, max_retries=0)
        with pytest.raises(openai.APIConnectionError):
            sdk.videos.retrieve(job_id)
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        assert browser.save_screenshot(str(SCREENSHOT.with_name("reconnecting.png")))
        front_end.start()  # the same port and data folder
        ready = "return document.getElementById('video').readyState"
        wait_for(lambda: browser.execute_script(ready) >= 2, 300, "the clip after the restart")
        assert find(By.ID, "status").text == "completed, step 400 of 400 (100 %)"
        assert not find(By.ID, "error").is_displayed()
        assert (sdk.videos.retrieve(job_id).status, find(By.ID, "job-id").text) == ("completed", job_id)
        assert browser.save_screenshot(str(SCREENSHOT.with_name("reconnected.png")))
    finally:
        browser.quit()
        front_end.stop()
