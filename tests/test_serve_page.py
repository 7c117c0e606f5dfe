"""The web page of `mtrain serve` in a real headless browser (Debian's chromium, driven by
chromium-driver through Selenium): load it, type, click, read the translation, save a
screenshot. The server is the real one in a subprocess, with its default settings (no keys).

Outside CI a machine without the browser skips this, saying what to install; in CI (CI=true)
.ci/run installs it, so a missing browser fails."""

from __future__ import annotations

import os
import re
import shutil

import httpx
import pytest

from tests.conftest import needed_in_ci
from tests.servers import DECODE, SENTENCES, Server

BROWSER = ("chromium", "chromedriver")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    webdriver = needed_in_ci("selenium.webdriver", "pip install selenium (the dev extra)")
    found = {name: shutil.which(name) for name in BROWSER}
    if not all(found.values()):
        missing = " and ".join(name for name, path in found.items() if path is None)
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{missing} not found in CI: .ci/run installs chromium and chromium-driver")
        pytest.skip(f"no browser to test the page with ({missing} not found): apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = found["chromium"]  # with the driver's path given, Selenium looks nothing up online
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1100,760",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium')}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=found["chromedriver"]))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(run_dir, tmp_path_factory):
    started = Server(f"run={run_dir}", *DECODE, cwd=tmp_path_factory.mktemp("page"))
    yield started
    assert started.stop() == 0, started.stderr()


def test_the_page_translates_in_a_real_browser(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]  # nothing from elsewhere may load
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page.text)
    expected = httpx.post(f"{server.url}/translate", json={"text": SENTENCES[:2]}).json()["translations"]
    with_alternatives = httpx.post(
        f"{server.url}/translate", json={"q": SENTENCES[0], "source": "de", "target": "en", "alternatives": 1}
    ).json()

    browser.get(f"{server.url}/")
    wait = WebDriverWait(browser, 60)
    wait.until(lambda driver: Select(driver.find_element(By.ID, "target")).options)
    assert Select(browser.find_element(By.ID, "source")).first_selected_option.text == "German (de)"
    assert Select(browser.find_element(By.ID, "target")).first_selected_option.text == "English (en)"
    browser.find_element(By.ID, "text").send_keys("\n".join(SENTENCES[:2]))
    browser.find_element(By.ID, "translate").click()
    wait.until(lambda driver: driver.find_element(By.ID, "translation").text)
    assert browser.find_element(By.ID, "translation").text.split("\n") == expected
    assert not browser.find_element(By.ID, "alternatives-box").is_displayed()

    text = browser.find_element(By.ID, "text")
    text.clear()
    text.send_keys(SENTENCES[0])
    Select(browser.find_element(By.ID, "alternatives")).select_by_value("1")
    browser.find_element(By.ID, "translate").click()
    wait.until(lambda driver: driver.find_element(By.ID, "status").text.startswith("Translated in"))
    assert browser.find_element(By.ID, "translation").text == with_alternatives["translatedText"]
    shown = [item.text for item in browser.find_elements(By.CSS_SELECTOR, "#alternatives-list li")]
    assert shown == with_alternatives["alternatives"]
    screenshot = tmp_path / "page.png"
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
