"""Take the README's screenshot of one sweep in MLflow's UI, as served by `hydrali ui`.

    hydrali ui tracking.ui_port=5091 &                 # in the directory that holds the sweep's mlflow.db
    python docs/screenshot_ui.py http://127.0.0.1:5091 docs/sweep_in_mlflow_ui.png

Needs Playwright (`pip install playwright`) and a Chromium (`playwright install chromium`, or a system one
given by CHROMIUM=/usr/bin/chromium). A development tool: nothing in hydrali imports it.
"""

import os
import sys

from playwright.sync_api import sync_playwright


def main(url: str, out: str) -> None:
    """Open the experiment's runs, switch to model training, expand the sweep's parent run, save a PNG."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=os.environ.get("CHROMIUM") or None, args=["--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": 1500, "height": 620})
        page.goto(f"{url}/#/experiments/1/runs")
        page.wait_for_selector("text=sweep ", timeout=60000)
        for name in ("Model training",):
            if page.get_by_text(name, exact=True).count():
                page.get_by_text(name, exact=True).first.click()
        close = page.locator("[aria-label='Close']")  # the assistant's side panel, if shown
        if close.count():
            close.first.click()
        page.wait_for_selector("text=sweep ", timeout=60000)
        page.locator("[data-testid='runs-table'] button, .ag-row button").first.click()  # expand the parent
        page.wait_for_timeout(2000)
        page.screenshot(path=out)
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
