"""The dashboard in a real browser: Debian's headless Chromium driven by Playwright, in
front of troupe and the real engine, behind an API key.

Playwright's API is asyncio's, so the browser is driven from a worker thread with the
sync API while the router runs in this test's Trio loop; the thread reaches back into
the loop with `trio.from_thread`.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import trio
from playwright.sync_api import Page, expect, sync_playwright

from troupe.sched import Status
from troupe_rig.router import RunningRouter, open_router

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "build" / "screenshots" / "dashboard.png"
ACTIVITY_SHOT = ROOT / "build" / "screenshots" / "dashboard-activity.png"
KEY = "dashboard-secret"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 30_000


def card(page: Page, model: str) -> str:
    return f'article[data-model="{model}"]'


def drive(
    router: RunningRouter, chromium: Path, profile: Path, shot: Path, activity_shot: Path
) -> None:
    """The browser's side of the test (in a worker thread)."""

    async def figure(model: str) -> tuple[str, str]:
        """The card's context and memory need as GET /models gives them, once the
        engine has projected the model (troupe doctor and troupe models show the same)."""
        await router.ctx.scheduler.wait_until(
            lambda snap: snap.models[model].memory_source == "engine"
        )
        async with router.client(headers={"Authorization": f"Bearer {KEY}"}) as http:
            items = (await http.get("/models")).json()["data"]
        extra = next(m for m in items if m["id"] == model)["troupe"]
        context = f"{extra['context']['n_ctx']} ({extra['context']['why']})"
        need = ", ".join(
            f"{dev} {n / 2**20:.1f} MiB" for dev, n in extra["memory"]["need_bytes"].items()
        )
        return context, f"{need} (engine)"

    async def request(model: str) -> int:
        async with router.client(headers={"Authorization": f"Bearer {KEY}"}) as http:
            body = {"model": model, "prompt": "hello", "n_predict": 4}
            return (await http.post("/completion", json=body)).status_code

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True
        )
        try:
            context.set_default_timeout(WAIT_MS)
            page = context.pages[0] if context.pages else context.new_page()
            page.goto(router.url + "/troupe/")
            # No key yet: the page asks for one; a wrong one is refused.
            expect(page.locator("#key-form")).to_be_visible()
            page.fill("#key-input", "wrong")
            page.click("#key-form button")
            expect(page.locator("#key-error")).to_have_text("the API key was refused")
            page.fill("#key-input", KEY)
            page.click("#key-form button")
            expect(page.locator("#connection")).to_have_text("live")
            expect(page.locator("#key-form")).to_be_hidden()
            status = page.locator(card(page, "tiny-a") + " .status")
            expect(status).to_have_text("unloaded")
            shown_context, need = trio.from_thread.run(figure, "tiny-a")
            assert shown_context == "256 (ctx-size)"
            expect(page.locator(card(page, "tiny-a") + " .context")).to_have_text(shown_context)
            expect(page.locator(card(page, "tiny-a") + " .memory-need")).to_have_text(need)

            # A request loads the model; the card follows /models/sse.
            assert trio.from_thread.run(request, "tiny-a") == 200
            expect(status).to_have_text("loaded")
            expect(page.locator(card(page, "tiny-a") + " .last-load")).to_contain_text(" s")
            # Where its child runs: troupe's lane for it (alone: every core).
            cores = len(os.sched_getaffinity(0))
            threads = f"{cores} thread{'' if cores == 1 else 's'}"
            expect(page.locator(card(page, "tiny-a") + " .cpu")).to_contain_text(threads)
            # The model's log tail shows what its child printed.
            child_lines = trio.from_thread.run_sync(
                lambda: [ln.text for ln in router.ctx.logs.recent("tiny-a") if ln.source == "child"]
            )
            some_line = next(ln for ln in child_lines if "llama" in ln)
            log = page.locator(card(page, "tiny-a") + " .log")
            expect(log).to_contain_text(some_line)
            expect(log).to_contain_text("[troupe] loaded: the child is ready")
            # Charts have data once /metrics was read twice.
            page.wait_for_function(
                "document.querySelectorAll('#chart-memory canvas, #chart-requests canvas')"
                ".length === 2"
            )
            expect(page.locator("#summary")).to_contain_text("1 running")
            # The memory chart plots the child (its RSS), by model: not the machine, "host".
            page.wait_for_function(
                "(document.querySelector('#chart-memory').dataset.series || '').includes('tiny-a')"
            )
            series = page.locator("#chart-memory").get_attribute("data-series") or "[]"
            assert json.loads(series) == ["tiny-a"]
            pid = trio.from_thread.run_sync(lambda: router.snapshot.models["tiny-a"].pid)
            process = page.locator(card(page, "tiny-a") + " .process")
            expect(process).to_contain_text(f"pid {pid}, port ")
            page.screenshot(path=str(shot), full_page=True)

            # The activity view: the request, its model, status and tokens (the ring's).
            row = page.locator('#activity-rows tr[data-model="tiny-a"]').first
            expect(row).to_have_attribute("data-status", "200")
            expect(row).to_contain_text("POST /completion")
            expect(row).to_contain_text("+ 4")  # prompt + 4 completion tokens
            # Charts keep their history across a reload: the server's samples come first.
            trio.from_thread.run(router.ctx.history.wait_for, 3)
            kept = trio.from_thread.run_sync(lambda: len(router.ctx.history.points()))
            page.reload()
            expect(page.locator("#connection")).to_have_text("live")  # the key was kept
            page.wait_for_function(
                f"Number(document.querySelector('#charts').dataset.history) >= {kept}"
            )
            page.wait_for_function(
                "document.querySelectorAll('#chart-memory canvas, #chart-requests canvas')"
                ".length === 2"
            )
            # Its x axis spans the whole 5-minute window from the first draw, so its ticks
            # read as minutes, not as milliseconds of a page just opened.
            span = page.locator("#charts").get_attribute("data-span")
            assert span is not None
            assert int(span) >= 299
            expect(row).to_have_attribute("data-status", "200")
            page.locator("#activity").scroll_into_view_if_needed()
            page.screenshot(path=str(activity_shot), full_page=True)
            # The favicon the page names is served (no 404 in the console).
            icon = page.request.get(router.url + "/troupe/favicon.svg")
            assert icon.status == 200
            assert icon.headers["content-type"].startswith("image/svg+xml")

            # Unload from the page; the card sees it go.
            page.click(card(page, "tiny-a") + " button.unload")
            expect(status).to_have_text("unloaded")
            expect(log).to_contain_text("[troupe] stopped (exit code 0)")
            expect(page.locator(card(page, "tiny-a") + " .action-error")).to_have_text("")
            expect(page.locator(card(page, "tiny-a") + " .memory-used")).to_have_text("-")
        finally:
            context.close()


async def test_dashboard_in_chromium(
    engine_path: Path, tiny_model_dir: Path, chromium_path: Path, tmp_path: Path
) -> None:
    args = ["--models-dir", str(tiny_model_dir), "--ctx-size", "256", "--parallel", "1"]
    shot = tmp_path / "dashboard.png"
    activity_shot = tmp_path / "dashboard-activity.png"
    async with open_router(
        [*args, "--api-key", KEY], engine=engine_path, state_dir=tmp_path / "state", cwd=tmp_path
    ) as router:
        await trio.to_thread.run_sync(
            drive, router, chromium_path, tmp_path / "profile", shot, activity_shot
        )
        assert router.status("tiny-a") is Status.UNLOADED
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shot, SCREENSHOT)
    shutil.copyfile(activity_shot, ACTIVITY_SHOT)
    print(f"dashboard screenshots: {shot}, {activity_shot} (copied to {SCREENSHOT.parent})")
