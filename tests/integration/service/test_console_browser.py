"""The console in a real browser: Debian's chromium, headless, driven by selenium through Debian's
chromedriver (nothing downloaded), against ``txn-offsets serve`` (a subprocess, with a token) over
the real stack and real jobs: :mod:`tests.integration.service.console_spark_jobs` runs them with
``run_job`` on the test session's shared local Spark session, one paused in a batch (running), one
fenced by an operator's reset through the CLI.

One browser for the module. ``CONSOLE_SCREENSHOTS=<dir>`` saves the pages as PNGs there (how
docs/img/console-*.png were made)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import Cli, produce_counts
from tests.integration.service.console_jobs import HOSTILE_REASON, REASON
from tests.integration.service.console_spark_jobs import PAYLOAD, SparkConsoleJobs, make_spark_jobs
from tests.integration.service.test_serve_ops import serving
from txn_offsets.config import DatabaseSettings, KafkaSettings
from txn_offsets.service.console.auth import COOKIE

TOKEN = "browser-token-0123456789abcdef"
CHROMIUM = "/usr/bin/chromium"  # Debian's, with its chromedriver: selenium downloads nothing
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def jobs(request: pytest.FixtureRequest, spark: Any) -> Iterator[SparkConsoleJobs]:
    value = request.getfixturevalue
    topic = value("topic_factory")(partitions=2)
    kafka = KafkaSettings(value("kafka_bootstrap"))
    made = make_spark_jobs(spark, value("engine"), value("migrated"), kafka, topic, value("run_cli"))
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not Path(p).exists()]
    if missing:
        pytest.fail(
            f"{', '.join(missing)} missing: `make install` (as root) installs chromium and chromium-driver"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service as DriverService
    except ImportError:
        pytest.fail("selenium missing: `make install` installs the dev extra")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    options.add_argument("--window-size=1400,1000")
    driver = webdriver.Chrome(options=options, service=DriverService(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


def _serving(database_url: str, kafka_bootstrap: str, schema: str) -> AbstractContextManager[str]:
    """`txn-offsets serve` with a token and the Grafana URL; Kafka's facts never cached (a page
    shows what the jobs just did)."""
    env = {
        **os.environ,
        "TXN_OFFSETS_DATABASE_URL": database_url,
        "TXN_OFFSETS_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "TXN_OFFSETS_SERVE_TOKEN": TOKEN,
        "TXN_OFFSETS_SERVE_GRAFANA_URL": "https://grafana.example",
    }
    return serving(env, schema, "--kafka-cache-s", "0")


def _shot(driver: Any, name: str) -> None:
    where = os.environ.get("CONSOLE_SCREENSHOTS")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(1400, max(600, min(int(height) + 200, 3000)))
        assert driver.save_screenshot(str(Path(where) / f"console-{name}.png"))
        driver.set_window_size(1400, 1000)


def _row_text(driver: Any, job: str) -> str:
    from selenium.webdriver.common.by import By

    link = driver.find_element(By.LINK_TEXT, job)
    return str(link.find_element(By.XPATH, "./ancestor::tr").text)


# chromedriver's answer when it asks about a node of a page that is being replaced, instead of a
# stale element reference (CI, 2026-12-01: the log-out button's click; the old page was going)
_NODE_LEFT = "does not belong to the document"


def _gone(old: Any) -> bool:
    """Whether the element `old` has left the page: selenium's stale reference, or chromedriver's
    inspector error for a node the document no longer holds. Any other error is raised."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    try:
        old.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as error:
        if _NODE_LEFT in str(error.msg):
            return True
        raise
    return False


def _navigate(driver: Any, element: Any) -> None:
    """Click `element` (a link or a form's button) and return once the page it leads to has loaded:
    click() may return before a form's request has been answered (CI once looked for the lineage
    verdict on the form's own page), so wait for the old page to go, then for the new one."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    old = driver.find_element(By.TAG_NAME, "html")
    element.click()
    wait = WebDriverWait(driver, 15)
    wait.until(lambda _: _gone(old))
    wait.until(lambda d: d.execute_script("return document.readyState") == "complete")


def _login(driver: Any, url: str, token: str) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{url}/console/")
    assert driver.current_url == f"{url}/console/login"  # sent to the form
    field = driver.find_element(By.NAME, "token")
    field.send_keys(token)
    _navigate(driver, field.find_element(By.XPATH, "./ancestor::form//button"))


def test_console_in_a_browser(
    browser: Any,
    jobs: SparkConsoleJobs,
    run_cli: Cli,
    database_url: str,
    kafka_bootstrap: str,
    migrated: DatabaseSettings,
) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.delete_all_cookies()
    with _serving(database_url, kafka_bootstrap, migrated.schema) as url:
        driver.get(f"{url}/console/jobs/{jobs.held}")  # no cookie yet: the login form only
        assert driver.current_url == f"{url}/console/login"
        assert jobs.held not in driver.find_element(By.TAG_NAME, "body").text
        _login(driver, url, "not-the-token-at-all")
        assert "Wrong token." in driver.find_element(By.TAG_NAME, "body").text
        assert driver.get_cookie(COOKIE) is None
        _shot(driver, "login")
        _login(driver, url, TOKEN)
        assert driver.current_url == f"{url}/console/"
        cookie = driver.get_cookie(COOKIE)
        assert cookie is not None and cookie["httpOnly"] is True and cookie["sameSite"] == "Strict"
        assert TOKEN not in cookie["value"]
        assert "running" in _row_text(driver, jobs.held).split()  # a live run, paused in a batch
        assert "running" in _row_text(driver, jobs.fenced).split()  # not fenced yet
        assert "idle" in _row_text(driver, jobs.done).split()  # ended, caught up

        # the service has seen the jobs once; now an operator resets the fenced job's live run
        jobs.fence(run_cli)
        produce_counts(kafka_bootstrap, jobs.topic, {0: 5})  # the held job's lag grows
        time.sleep(1.1)  # the next sample of the lag history
        driver.refresh()
        # every sample since saw its lag grow: lagging (the service's LAGGING), its chart red
        assert "lagging" in _row_text(driver, jobs.held).split()
        assert "fenced" in _row_text(driver, jobs.fenced).split()
        assert "stopped with lag" in _row_text(driver, jobs.done)  # ended; records came since
        chart = driver.find_element(By.LINK_TEXT, jobs.held).find_element(
            By.XPATH, "./ancestor::tr//*[local-name()='svg']"
        )
        assert chart.get_attribute("class") == "growing"
        _shot(driver, "overview")

        _navigate(driver, driver.find_element(By.LINK_TEXT, jobs.fenced))
        history = driver.find_element(By.XPATH, "//h2[starts-with(., 'History')]/following-sibling::table[1]")
        newest = history.find_element(By.XPATH, ".//tbody/tr[1]").text
        assert "reset" in newest and REASON in newest
        runs = driver.find_element(By.XPATH, "//h2[.='Runs']/following-sibling::table[1]").text
        # how its run ended, as the store recorded it (runs, migration 0013)
        assert "fenced by generation 2 (reset by " in runs and f": {REASON})" in runs
        _shot(driver, "job")

        driver.get(f"{url}/console/jobs/{jobs.failing}")  # the runner noted its error's class only
        runs = driver.find_element(By.XPATH, "//h2[.='Runs']/following-sibling::table[1]").text
        assert "failed: BatchFailed: caused by RuntimeError" in runs and PAYLOAD not in driver.page_source

        committed = jobs.committed(jobs.done, 0, 7)  # what the done job's run wrote, read in SQL
        assert committed.generation == jobs.done_summary.generation
        driver.get(f"{url}/console/lineage")
        for name, value in (("job", jobs.done), ("topic", jobs.topic), ("partition", "0"), ("offset", "7")):
            driver.find_element(By.NAME, name).send_keys(value)
        _navigate(driver, driver.find_element(By.XPATH, "//form[@action='/console/lineage']//button"))
        verdict = driver.find_element(By.CLASS_NAME, "verdict").text
        span = f"[{committed.from_off}, {committed.until_off})"
        assert f"committed in {span} by run {committed.run_id} (generation {committed.generation})" in verdict
        found = driver.find_element(By.XPATH, "//table/tbody/tr[1]").text
        assert committed.run_id in found and span in found
        assert committed.committed_at.isoformat(timespec="seconds") in found  # when
        _shot(driver, "lineage")

        driver.get(f"{url}/console/")
        _navigate(driver, driver.find_element(By.LINK_TEXT, jobs.hostile))  # its name shown as the text it is
        body = driver.find_element(By.TAG_NAME, "body").text
        assert "\\x1b[31m<script>alert(1)</script><b>bold</b>\\u202eevil" in body
        assert HOSTILE_REASON not in body
        for tag in ("script", "img", "b"):  # nothing of the stored text became an element
            assert driver.find_elements(By.TAG_NAME, tag) == [], tag
        assert driver.find_element(By.TAG_NAME, "h1").text == f"Job {jobs.hostile}"
        assert jobs.release().generation == 1  # the held run goes on, catches up, ends
        driver.get(f"{url}/console/jobs/{jobs.held}")
        runs = driver.find_element(By.XPATH, "//h2[.='Runs']/following-sibling::table[1]").text
        assert "finished (lease released)" in runs

        # logging out: the nav's button POSTs, the cookie is cleared, the pages ask for the token
        _navigate(driver, driver.find_element(By.XPATH, "//nav//button[.='Log out']"))
        assert driver.current_url == f"{url}/console/login"
        assert driver.get_cookie(COOKIE) is None
        driver.get(f"{url}/console/jobs/{jobs.held}")
        assert driver.current_url == f"{url}/console/login"
        assert jobs.held not in driver.find_element(By.TAG_NAME, "body").text


class _Node:
    """An element whose is_enabled() answers as chromedriver did for the page it was on."""

    def __init__(self, answer: Exception | None) -> None:
        self.answer = answer

    def is_enabled(self) -> bool:
        if self.answer is not None:
            raise self.answer
        return True


def test_a_node_the_document_no_longer_holds_is_gone() -> None:
    """What made CI fail on 2026-12-01: chromedriver answered is_enabled() on the old page's root
    with an inspector error instead of a stale reference, and selenium's staleness_of raised it."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException

    left = WebDriverException(
        'unknown error: unhandled inspector error: {"code":-32000,"message":"Node with given id does'
        ' not belong to the document"}'
    )
    from selenium.webdriver.support.expected_conditions import staleness_of

    with pytest.raises(WebDriverException, match="does not belong"):  # selenium's own wait gives up
        staleness_of(_Node(left))(None)
    assert _gone(_Node(left)) is True
    assert _gone(_Node(StaleElementReferenceException("stale"))) is True
    assert _gone(_Node(None)) is False  # still on the page: wait on
    with pytest.raises(WebDriverException, match="chrome not reachable"):
        _gone(_Node(WebDriverException("unknown error: chrome not reachable")))
