"""The console in a real browser (Debian's headless Chromium, driven by Selenium), against the
real broker and a real worker: an operator opens a session's timeline, revokes the memory its
packet held, with a reason; the next question's packet no longer holds it; the user's page
and `mnemoflow audit --user` show the revoke with its reason and who did it; a replay of the
first question's recall, answered by the worker, shows the memory gone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait
from test_gateway_kafka import served
from test_memories_cli_kafka import FACT, ask, tell

from mnemoflow.streams import audit_cli
from mnemoflow.streams.audit_sync import open_store
from mnemoflow.streams.console import KafkaSource, create_app
from mnemoflow.streams.decisions import DecisionWatcher
from mnemoflow.streams.host import HostClient
from mnemoflow.streams.inbox import InboxClient

from factories import T0
from support import collect, isolated_settings, ready_worker, run_cli

pytestmark = pytest.mark.kafka
DAY = 86_400_000
REASON = "user asked to forget the code"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# where a run also leaves its screenshots (the README's is made this way), if set
SHOTS = os.environ.get("MNEMOFLOW_CONSOLE_SCREENSHOTS")


def _browser(profile: Path) -> webdriver.Chrome:
    for path in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(path), f"{path} is missing: `make test` installs Debian's chromium " \
                                   f"and chromium-driver (make browser)"
    opts = Options()
    opts.binary_location = CHROMIUM
    # without the background-networking flags Chromium keeps calling hosts this closed
    # network refuses
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--window-size=1280,1400",
                 f"--user-data-dir={profile}"):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)


def _shot(driver: webdriver.Chrome, tmp: Path, name: str) -> None:
    driver.save_screenshot(str(tmp / name))
    if SHOTS:
        Path(SHOTS).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(SHOTS) / name))


def revoke_in_timeline(driver: webdriver.Chrome, url: str, session: str, text: str,
                       tmp: Path) -> tuple[str, str]:
    """On the session's page: the first packet item holding `text`, revoked through its form
    with the reason, and with what it was taken from where it has a source (a fact: checked by
    default; a segment has none). The memory id, and the message the console answered with."""
    driver.get(f"{url}/sessions/{session}")
    _shot(driver, tmp, "console-session.png")
    row = driver.find_elements(By.XPATH, f"//tr[@class='item'][td[contains(., '{text}')]]")[0]
    mid = row.find_element(By.CSS_SELECTOR, "td.mono a").text
    row.find_element(By.NAME, "reason").send_keys(REASON)
    boxes = row.find_elements(By.NAME, "sources")
    assert [b.is_selected() for b in boxes] == ([True] if mid.startswith("fact:") else []), mid
    row.find_element(By.TAG_NAME, "button").click()
    WebDriverWait(driver, 30).until(EC.presence_of_element_located((By.ID, "msg")))
    return mid, driver.find_element(By.ID, "msg").text


def replay_in_browser(driver: webdriver.Chrome, url: str, packet_id: str, tmp: Path) -> str:
    """On the packet's page: replay its recall; the replay page's table of candidates then
    and now (the page reloads itself until the worker has answered)."""
    driver.get(f"{url}/packets/{packet_id}")
    driver.find_element(By.CSS_SELECTOR, "#replay button").click()
    WebDriverWait(driver, 60).until(EC.presence_of_element_located((By.ID, "diff")))
    _shot(driver, tmp, "console-replay.png")
    return driver.find_element(By.ID, "diff").text


async def packet_of(s, bootstrap: str, session: str) -> str:  # type: ignore[no-untyped-def]
    """The id of the packet the broker injected in the session."""
    got = await collect(s, bootstrap, ["audit"], lambda r: any(
        a["sessionId"] == session and a["action"] == "inject" for a in r["audit"]), 60)
    (pid,) = [a["packetId"] for a in got["audit"]
              if a["sessionId"] == session and a["action"] == "inject"]
    return str(pid)


@contextlib.asynccontextmanager
async def console(s, bootstrap: str) -> AsyncIterator[str]:  # type: ignore[no-untyped-def]
    source = KafkaSource(s, bootstrap, open_store(s, s.home / "console.duckdb"))

    @contextlib.asynccontextmanager
    async def lifecycle() -> AsyncIterator[None]:
        await source.start()
        try:
            yield
        finally:
            await source.stop()

    try:
        async with served(create_app(source, actor="ops", refresh_s=1.0,
                                     lifecycle=lifecycle)) as url:
            yield url
    finally:
        source.store.close()


async def test_an_operator_revokes_a_memory_in_the_browser(
        kafka_bootstrap, tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    s = isolated_settings(tmp_path, "console", consolidate_idle_s=3600.0)
    async with ready_worker(s, kafka_bootstrap), HostClient(s, kafka_bootstrap) as host, \
            DecisionWatcher(s, kafka_bootstrap) as watcher:
        inbox = InboxClient(s, kafka_bootstrap, host.producer)
        await inbox.start()
        try:
            await tell(host, inbox, watcher, "mem-a", "user-a", FACT, T0)
            await collect(s, kafka_bootstrap, ["memory-log"], lambda r: any(
                m["op"] in ("fact_upserted", "fact_proposed") for m in r["memory-log"]), 60)
            first = await ask(host, inbox, watcher, "ask-1", T0 + DAY)
            assert any("zq417x" in i["text"] for i in first), first
            first_pid = await packet_of(s, kafka_bootstrap, "ask-1")

            async with console(s, kafka_bootstrap) as url:
                driver = await asyncio.to_thread(_browser, tmp_path / "chromium")
                try:
                    mid, said = await asyncio.to_thread(revoke_in_timeline, driver, url,
                                                        "ask-1", "zq417x", tmp_path)
                    # the packet held the fact or (seen once, in a fresh-clone make test) the
                    # segment it was extracted from: either way the segment is revoked, and
                    # its cascade takes the fact
                    assert f"by ops: {REASON}" in said and "memory_revoked seg:" in said, said
                    assert mid.startswith(("fact:", "seg:")), mid

                    second = await ask(host, inbox, watcher, "ask-2", T0 + 2 * DAY)
                    assert all("zq417x" not in i["text"] for i in second), second

                    def user_page() -> str:
                        driver.get(f"{url}/users/user-a")
                        _shot(driver, tmp_path, "console-user.png")
                        return driver.find_element(By.ID, "actions").text

                    actions = await asyncio.to_thread(user_page)
                    assert "memory_revoked" in actions and REASON in actions and "ops" in actions
                    # the first question's recall, replayed against today's memory by the
                    # worker: the revoked fact is gone from what it would give
                    diff = await asyncio.to_thread(replay_in_browser, driver, url, first_pid,
                                                   tmp_path)
                    assert "zq417x" in diff and "gone" in diff, diff
                finally:
                    await asyncio.to_thread(driver.quit)
        finally:
            await inbox.stop()
    cli = s.with_overrides(bootstrap=kafka_bootstrap)
    audit = json.loads(await run_cli(audit_cli, cli, capsys, "audit", "--user", "user-a",
                                     "--json"))
    revoked = [x for x in audit["operatorActions"] if x["op"] == "memory_revoked"]
    assert revoked and all(x["reason"] == REASON and x["actor"] == "ops" for x in revoked)
    assert any(x["memoryId"].startswith("seg:") for x in revoked), revoked
