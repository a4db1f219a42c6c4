"""Screenshot a Dagster UI page in headless Chromium after clicking through it: the community dialog,
then each given text (e.g. "[Show Markdown]" opens a plot), or with ``aria:LABEL`` every control with that label,
one after the other (``aria:unfold_more`` expands every group of the global lineage). How the UI checks of
docs/dagster.md are made.

Usage: python scripts/ui_screenshot.py URL OUT.png [TEXT_TO_CLICK | aria:LABEL ...] [--size=WIDTHxHEIGHT]
(apt-get install chromium)
"""

import base64
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import websocket  # websocket-client, installed with dagster's dependencies

PORT = 9333
# Headless, and offline: no update checks, sync or first-run pages (the machine may have no network at all).
QUIET_BROWSER = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
)  # fmt: skip
CLICK = """(() => {{
  const found = [...document.querySelectorAll('button, a, span, div')].filter(e => e.textContent.trim() === {text});
  if (found.length) {{ found[found.length - 1].click(); return true; }}
  return false;
}})()"""
# Click the first control labelled so until none is left (each click may redraw the page).
CLICK_LABELLED = """(async () => {{
  let clicked = 0;
  for (; clicked < 50; clicked++) {{
    const found = document.querySelector(`[aria-label="${{{label}}}"]`);
    if (!found) break;
    (found.closest('button, [role=button]') || found).click();
    await new Promise(done => setTimeout(done, 1500));
  }}
  return clicked;
}})()"""


def main(url: str, out: Path, clicks: list[str], size: tuple[int, int] = (1400, 1600)) -> None:
    profile = tempfile.mkdtemp(prefix="ui-screenshot-")  # a fresh profile: nothing of a previous session shows
    browser = ["chromium", *QUIET_BROWSER, f"--user-data-dir={profile}", f"--remote-debugging-port={PORT}"]
    proc = subprocess.Popen([*browser, "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        tabs: list[dict[str, Any]] = []
        for _ in range(50):
            try:
                tabs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{PORT}/json"))
                break
            except OSError:
                time.sleep(0.2)
        page = next(t for t in tabs if t["type"] == "page")
        ws = websocket.create_connection(page["webSocketDebuggerUrl"])
        counter = iter(range(1, 1_000_000))

        def call(method: str, **params: Any) -> dict[str, Any]:
            ident = next(counter)
            ws.send(json.dumps({"id": ident, "method": method, "params": params}))
            while True:
                message = json.loads(ws.recv())
                if message.get("id") == ident:
                    return dict(message.get("result", {}))

        call("Page.enable")
        call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1, mobile=False)
        call("Page.navigate", url=url)
        time.sleep(12)  # the UI loads its GraphQL data after the page
        for text in ["Skip", *clicks]:
            label = text.removeprefix("aria:")
            labelled = label != text
            script = CLICK_LABELLED.format(label=json.dumps(label)) if labelled else CLICK.format(text=json.dumps(text))
            result = call("Runtime.evaluate", expression=script, returnByValue=True, awaitPromise=True)
            print(f"clicked {text!r}: {result.get('result', {}).get('value')}")
            time.sleep(3)
        out.write_bytes(base64.b64decode(call("Page.captureScreenshot", format="png")["data"]))
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    options = [a for a in sys.argv[3:] if a.startswith("--size=")]
    width, _, height = (options[-1].removeprefix("--size=") if options else "1400x1600").partition("x")
    main(sys.argv[1], Path(sys.argv[2]), [a for a in sys.argv[3:] if a not in options], (int(width), int(height)))
