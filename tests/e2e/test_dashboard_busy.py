"""The dashboard of a busy router in Debian's headless Chromium (Playwright): two models
loaded, one loading, a stream running (the fake engine, whose load and speed a test
sets). The cards show each child's pid, port, uptime and live tokens per second and the
KV store in words; the memory chart plots each model's child, not the machine; the time
axis' labels do not overlap; a filter narrows the page to one model. Its screenshot is
``docs/dashboard.png`` (copied by hand from build/screenshots/dashboard-busy.png).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import trio
from playwright.sync_api import Page, expect, sync_playwright

from troupe.sched import Status
from troupe_rig.router import RouterFactory, RunningRouter

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "build" / "screenshots" / "dashboard-busy.png"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update"]  # fmt: skip
WAIT_MS = 30_000
# What the page's axis labels are drawn in (uPlot's default axis font, near enough).
_OVERLAPS = """(el) => {
  const ticks = JSON.parse(el.dataset.ticks || "[]");
  const ctx = document.createElement("canvas").getContext("2d");
  ctx.font = "12px system-ui, -apple-system, sans-serif";
  const out = [];
  for (let i = 1; i < ticks.length; i++) {
    const [x0, a] = ticks[i - 1], [x1, b] = ticks[i];
    const room = (ctx.measureText(a).width + ctx.measureText(b).width) / 2 + 4;
    if (x1 - x0 < room) out.push([a, b, x1 - x0, room]);
  }
  return {count: ticks.length, overlaps: out};
}"""


def card(model: str) -> str:
    return f'article[data-model="{model}"]'


def drive(router: RunningRouter, chromium: Path, shot: Path) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        try:
            page: Page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.set_default_timeout(WAIT_MS)
            page.goto(router.url + "/troupe/")
            expect(page.locator("#connection")).to_have_text("live")
            expect(page.locator(card("alpha") + " .status")).to_have_text("loaded")
            expect(page.locator(card("beta") + " .status")).to_have_text("loaded")
            expect(page.locator(card("gamma") + " .status")).to_have_text("loading")

            # Its child as troupe ps shows it: pid, port, uptime; and its stream's speed.
            pid = trio.from_thread.run_sync(lambda: router.snapshot.models["alpha"].pid)
            port = trio.from_thread.run_sync(lambda: router.snapshot.models["alpha"].port)
            alpha = page.locator(card("alpha"))
            expect(alpha.locator(".process")).to_have_text(f"pid {pid}, port {port}")
            expect(alpha.locator(".up")).to_have_text(re.compile(r"^\d+s$|^\d+m\d\ds$"))
            expect(alpha.locator(".tokens-per-second")).to_have_text(
                re.compile(r"^\d+\.\d \(1 stream now\)$")
            )
            # No stream now: the speed of its last request that ended (the child's timings).
            expect(page.locator(card("beta") + " .tokens-per-second")).to_have_text(
                re.compile(r"^none now \(last request \d+\.\d\)$")
            )
            expect(page.locator(card("gamma") + " .tokens-per-second")).to_have_text("-")
            # The KV store in words, not "0 saved, 0".
            expect(alpha.locator(".kv")).to_have_text(
                "no conversation stored yet; 0 restored, 0 saved since start"
            )

            # The memory chart: one series per model with a child, none for the machine.
            chart = page.locator("#chart-memory")
            page.wait_for_function(
                "JSON.parse(document.querySelector('#chart-memory').dataset.series || '[]')"
                ".length >= 3"
            )
            series = json.loads(chart.get_attribute("data-series") or "[]")
            assert set(series) == {"alpha", "beta", "gamma"}
            expect(page.locator("#chart-memory .u-legend")).not_to_contain_text("host")
            total = page.locator("#memory-total")
            expect(total).to_have_text(re.compile(r"^: \d+\.\d MiB together now$"))
            together = float(total.inner_text().split()[1])

            # The time axis: labels that do not overlap, on both charts.
            for which in ("#chart-memory", "#chart-requests"):
                found = page.locator(which).evaluate(_OVERLAPS)
                assert found["count"] >= 2, found
                assert found["overlaps"] == [], found
            page.screenshot(path=str(shot))
            # Narrower: two charts of about 380 px side by side; still no overlap.
            page.set_viewport_size({"width": 820, "height": 1000})
            page.wait_for_function(
                "document.querySelector('#chart-memory .uplot').offsetWidth < 420 && JSON.parse("
                "document.querySelector('#chart-memory').dataset.ticks).every(t => t[0] < 420)"
            )
            for which in ("#chart-memory", "#chart-requests"):
                found = page.locator(which).evaluate(_OVERLAPS)
                assert found["count"] >= 2, found
                assert found["overlaps"] == [], found

            # The filter narrows cards, series and requests to one model.
            page.select_option("#model-filter", "alpha")
            expect(page.locator(card("beta"))).to_be_hidden()
            expect(page.locator(card("gamma"))).to_be_hidden()
            expect(alpha).to_be_visible()
            # Alpha's child alone: a third. The total is redrawn after the cards are
            # hidden (not with them), so its new figure is waited for.
            page.wait_for_function(
                "([t]) => parseFloat(document.querySelector('#memory-total').textContent"
                ".split(' ')[1]) < t",
                arg=[together * 0.6],
            )
            alone = float(total.inner_text().split()[1])
            assert 0 < alone < together * 0.6, (alone, together)
            shown = page.evaluate(
                "[...document.querySelectorAll('#chart-memory .u-legend .u-series')]"
                ".filter(s => !s.classList.contains('u-off')).map(s => s.textContent.trim())"
            )
            assert [name for name in shown if name in series] == ["alpha"]
            rows = page.locator("#activity-rows tr:visible")
            expect(rows.first).to_have_attribute("data-model", "alpha")
            # The address keeps the choice: a reload shows the same model alone.
            assert page.url.endswith("#model=alpha")
            page.reload()
            expect(page.locator("#connection")).to_have_text("live")
            expect(page.locator("#model-filter")).to_have_value("alpha")
            expect(page.locator(card("beta"))).to_be_hidden()
            page.select_option("#model-filter", "")
            expect(page.locator(card("beta"))).to_be_visible()
        finally:
            browser.close()


async def _stream(router: RunningRouter, running: trio.Event) -> None:
    """A slow stream from alpha that runs until cancelled."""
    async with router.client(timeout=None) as http:
        body = {"model": "alpha", "prompt": "hello", "n_predict": 100000, "stream": True}
        async with http.stream("POST", "/completion", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: ") and json.loads(line[6:]).get("content"):
                    running.set()


async def test_busy_dashboard_in_chromium(
    fake_router: RouterFactory, chromium_path: Path, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"  # never made: gamma stays loading
    sections = {
        "alpha": {"fake-tps": "20"},
        "beta": {"fake-tps": "40"},
        "gamma": {"fake-load-time": "600", "fake-load-gate": str(gate)},
    }
    shot = tmp_path / "dashboard-busy.png"
    async with fake_router(sections) as router, router.client() as http:
        for model in ("alpha", "beta"):
            assert (await http.post("/models/load", json={"model": model})).status_code == 200
            await router.wait_for_status(model, Status.LOADED)
        assert (await http.post("/models/load", json={"model": "gamma"})).status_code == 200
        await router.wait_for_status("gamma", Status.LOADING)
        # A finished request for each loaded model (the activity table), then the stream.
        for model in ("beta", "alpha"):
            body = {"model": model, "prompt": "hi", "n_predict": 8}
            assert (await http.post("/completion", json=body)).status_code == 200
        async with trio.open_nursery() as nursery:
            running = trio.Event()
            nursery.start_soon(_stream, router, running)
            await running.wait()
            await router.ctx.history.wait_for(5)  # a few samples: the charts draw lines
            await trio.to_thread.run_sync(drive, router, chromium_path, shot)
            nursery.cancel_scope.cancel()
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, SCREENSHOT)
