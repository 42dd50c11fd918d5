"""Opens a stallscope HTML report from disk in headless Chromium (Debian's, driven by
Playwright), with the network cut off, and prints as JSON what the tests check: console errors
and page errors, the timeline's lanes, what clicking the longest stall shows, and the load
time. Takes a screenshot into the output directory."""
import json
import pathlib
import sys
import time

from playwright.sync_api import sync_playwright


def main(page_path, out_dir, chromium):
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    errors, requests = [], []
    with sync_playwright() as p:
        # Root has no sandbox to drop into; a container's /dev/shm can be too small for the
        # renderer. Neither changes what the page does.
        browser = p.chromium.launch(
            executable_path=chromium, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        # The page must need nothing but itself: anything else it asks for is refused.
        def route(r):
            if r.request.url.startswith("file://"):
                r.continue_()
            else:
                requests.append(r.request.url)
                r.abort()
        page.route("**/*", route)
        started = time.monotonic()
        page.goto(pathlib.Path(page_path).resolve().as_uri(), wait_until="load")
        page.wait_for_function("window.stallscope !== undefined", timeout=60000)
        load_s = time.monotonic() - started
        lanes = page.evaluate("window.stallscope.lanes()")
        advice = page.evaluate(
            "[...document.querySelectorAll('#advice > ol > li')].map((li) => li.dataset.cause)")
        data = page.evaluate("JSON.parse(document.getElementById('stallscope-data').textContent)")
        longest = None
        for ri, rec in enumerate(data["recordings"]):
            for g in rec["gpus"]:
                for i, s in enumerate(sorted(g["stalls"], key=lambda s: s["start_us"])):
                    lost = s["idle_ms"] + s["waiting_ms"]
                    if longest is None or lost > longest[0]:
                        longest = (lost, ri, g["index"], i, s)
        clicked = None
        if longest is not None:
            _, ri, gpu, i, stall = longest
            pt = page.evaluate(f"window.stallscope.stallPoint({ri}, {gpu}, {i})")
            page.mouse.move(pt["x"], pt["y"])
            tooltip = page.inner_text("#tooltip")
            page.mouse.click(pt["x"], pt["y"])
            ev = page.locator("#evidence")
            clicked = {
                "cause": stall["cause"],
                "point_cause": pt["cause"],
                "tooltip": tooltip,
                "visible": ev.is_visible(),
                "text": ev.inner_text() if ev.is_visible() else "",
                "evidence_threads": len(stall.get("evidence", {}).get("threads", [])),
            }
        page.screenshot(path=str(out / "report.png"), full_page=True)
        browser.close()
    json.dump({"errors": errors, "requests": requests, "lanes": lanes, "advice": advice,
               "clicked": clicked,
               "load_s": load_s, "screenshot": str(out / "report.png")}, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
