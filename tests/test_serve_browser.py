"""The page of ``sam3track serve`` in a real headless Chromium (Debian's package, driven by Playwright; it
FAILS when the browser is missing: .ci/run installs it): open a clip under --root, type a prompt, click a
point, propagate, see masks on the canvas and download a valid mask mp4. The server is the real command
line with the shipped demo bundle; a screenshot is kept in the test's temp folder."""

from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from sam3track.video import open_source

from .serve_helpers import CARPHONE, CHROMIUM, CHROMIUM_ARGS, CLIPS, start_cli_server, stop_cli_server

pytestmark = pytest.mark.slow

FIRST_FRAME = 96  # of the clip's 120
FRAMES = 120 - FIRST_FRAME  # what propagating forward from there tracks
WAIT_MS = 120_000  # a page step not done by then hangs (each takes under 10 s)
MASK_PIXELS = """() => {
    const c = document.getElementById("mask-canvas");
    const alpha = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let n = 0;
    for (let i = 3; i < alpha.length; i += 4) if (alpha[i] > 0) n++;
    return n;
}"""


def status_starts(page, text: str, what: str) -> None:
    """Wait (bounded) until the page's status line starts with ``text``; fail naming the step and status."""
    try:
        page.wait_for_function("(text) => document.getElementById('status').textContent.startsWith(text)",
                               arg=text, timeout=WAIT_MS)
    except Exception:
        pytest.fail(f"{what}: the page did not say {text!r} within {WAIT_MS // 1000} s; its status: "
                    f"{page.text_content('#status')!r}", pytrace=False)


@pytest.fixture(scope="module")
def served():
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install -y chromium (.ci/run installs it)"
    proc, url = start_cli_server("--root", str(CLIPS))
    yield url
    code, err = stop_cli_server(proc)
    assert code == 0 and "Traceback" not in err, err[-2000:]


def test_open_prompt_click_propagate_and_download_in_a_browser(served, tmp_path):
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1100, "height": 700}, accept_downloads=True)
        try:
            page = browser.new_page()
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(served + "/")
            status_starts(page, "open a video", "loading the page")
            page.select_option("#video-list", CARPHONE.name)
            page.click("#open")
            status_starts(page, "opened carphone_pristine.mp4", "opening the clip")
            page.fill("#scrubber", str(FIRST_FRAME))  # prompts on the last frames: a short propagation
            assert page.text_content("#frame-label") == f"frame {FIRST_FRAME} / 119"
            page.fill("#prompt", "person")
            page.click("#find")
            status_starts(page, "found", "finding the text prompt")
            box = page.locator("#marks-canvas").bounding_box()
            page.mouse.click(box["x"] + box["width"] * 0.3, box["y"] + box["height"] * 0.6)
            status_starts(page, "object", "clicking a point")
            clicked = page.locator("#objects li.selected").get_attribute("data-id")
            page.click("#propagate-forward")
            status_starts(page, f"propagated {FRAMES} frames", "propagating forward")
            assert page.text_content("#progress-text") == f"{FRAMES} / {FRAMES} frames"
            assert page.evaluate("document.getElementById('progress').value") == FRAMES
            assert page.evaluate(MASK_PIXELS) > 0, "no mask was drawn on the canvas after propagating"
            assert page.locator(f"#objects li[data-id='{clicked}']").count() == 1
            page.screenshot(path=str(tmp_path / "serve.png"))
            with page.expect_download(timeout=WAIT_MS) as download:
                page.click("#download-mp4")
            download.value.save_as(tmp_path / "masks.mp4")
            assert download.value.suggested_filename == "carphone_pristine.masks.mp4"
            assert errors == [], errors
        finally:
            browser.close()
    with open_source(tmp_path / "masks.mp4") as video:  # every frame from the first with masks to the last
        assert (len(video), video.width, video.height) == (FRAMES, 176, 144)
        assert video.read(FRAMES - 1).shape == (144, 176, 3)
    assert (tmp_path / "serve.png").stat().st_size > 0
