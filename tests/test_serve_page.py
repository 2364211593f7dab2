"""The page at `/` in a real headless Chromium (selenium + chromedriver): type a sentence, get
its translation, see the cross-attention heatmap; switch the layer. Marked slow (a server and
a browser: ~7 s). Skipped with a reason when Chromium, chromedriver or selenium is missing
(`.ci/run` installs them).

Run as a program, it screenshots the page of a running server (docs/img/serve.png):

    python -m tests.test_serve_page http://127.0.0.1:8000 docs/img/serve.png "A man rides a bike."
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.test_serve import make_tiny_run, post, serve

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
# Headless, and quiet on the network: without the background-networking flags Chromium keeps
# trying to reach its update and sync services.
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--window-size=1100,900",
]  # fmt: skip


def browser_missing() -> str | None:
    """Why the browser test cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).is_file():
            return f"{path} not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium not installed (pip install -e '.[dev]')"
    return None


def start_browser(profile: Path):  # noqa: ANN201  (selenium's WebDriver)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # with the driver's path too: no Selenium Manager
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def translate_on_page(driver, url: str, sentence: str) -> dict[str, str]:  # noqa: ANN001
    """Open the page, type `sentence`, press Translate, wait for the translation and the
    heatmap; what the page shows."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url + "/")
    wait = WebDriverWait(driver, 60)
    wait.until(lambda d: "parameters" in d.find_element(By.ID, "model-info").text)
    box = driver.find_element(By.ID, "source")
    box.clear()
    box.send_keys(sentence)
    driver.find_element(By.ID, "translate").click()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#translations li .tgt"))
    wait.until(lambda d: d.find_element(By.ID, "heatmap").get_attribute("data-rows"))
    canvas = driver.find_element(By.ID, "heatmap")
    return {
        "translation": driver.find_element(By.CSS_SELECTOR, "#translations li .tgt").get_attribute(
            "textContent"
        ),
        "rows": canvas.get_attribute("data-rows"),
        "cols": canvas.get_attribute("data-cols"),
        "layer": canvas.get_attribute("data-layer"),
        "error": driver.find_element(By.ID, "error").text,
    }


# Dark cells: pixels of the canvas whose red channel is below 128 (the ramp's dark end).
COUNT_DARK = """
const c = document.getElementById("heatmap");
const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
let n = 0;
for (let i = 0; i < d.length; i += 4) if (d[i] < 128 && d[i + 2] > d[i]) n++;
return n;
"""


@pytest.fixture(scope="module")
def driver() -> Iterator[object]:
    reason = browser_missing()
    if reason is not None:
        pytest.skip(reason)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        browser = start_browser(Path(profile))
        try:
            yield browser
        finally:
            browser.quit()


@pytest.mark.slow  # ~7 s: a server and a browser of its own
def test_page_translates_and_draws_the_attention(driver, tmp_path: Path) -> None:  # noqa: ANN001
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    sentence = "Zwei Hunde spielen im Park."
    with serve(make_tiny_run(tmp_path / "run"), "--beam", "2") as served:
        shown = translate_on_page(driver, served.url, sentence)
        _, answer = post(served.url, "/attention", {"sentence": sentence, "beam_size": 2})
        assert shown["error"] == ""
        assert shown["translation"] == answer["translation"]
        assert (int(shown["rows"]), int(shown["cols"])) == (
            len(answer["tgt_pieces"]),
            len(answer["src_pieces"]),
        )
        assert shown["layer"] == "mean"
        assert driver.execute_script(COUNT_DARK) > 0  # the heatmap has ink
        Select(driver.find_element(By.ID, "layer")).select_by_value("1")
        assert driver.find_element(By.ID, "heatmap").get_attribute("data-layer") == "1"
        shot = tmp_path / "serve.png"
        assert driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000


def main(argv: list[str]) -> int:
    """Screenshot the page of the server at argv[0] into argv[1], translating argv[2:]."""
    url, out, sentences = argv[0], argv[1], argv[2:] or ["A man rides a bike."]
    reason = browser_missing()
    if reason is not None:
        print(f"test_serve_page: {reason}", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        browser = start_browser(Path(profile))
        browser.set_window_size(1100, 1500)  # the heatmap below the translations, in view
        try:
            shown = translate_on_page(browser, url.rstrip("/"), "\n".join(sentences))
            browser.save_screenshot(out)
        finally:
            browser.quit()
    print(f"{shown['translation']!r}: heatmap {shown['rows']} x {shown['cols']}; saved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
