"""The dashboard in a real browser: JupyterLab + headless Chromium driven by Playwright.

The shipped quickstart notebook (notebooks/quickstart.ipynb), run cell by cell as a user would
(Shift+Enter), with two edits so it suits a 2-core test machine and a Stop: 2 local ranks
instead of 4 MPI ranks, and a training loop long enough to watch (and to stop). ``%hvd_start``
shows the dashboard with a row per rank; while the training cell runs (it calls
``hvd.report``) every row shows a non-zero samples/s that changes, and the timeline and
autotune buttons act; the Stop button ends the training cell (the same report as Ctrl-C) and
the cluster answers the next cell. Screenshots are saved as test artifacts
(``dashboard-training.png``, ``dashboard-after-stop.png``, ``notebook-after-stop.png``); the
first also becomes the README's picture when the dashboard's look changed
(tests/dashboard_picture.py).
"""

import contextlib
import json
import os
import re
import time

import nbformat
import pytest

import dashboard_picture

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(900)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(REPO, "notebooks", "quickstart.ipynb")
RATE = re.compile(r"([0-9.]+)([kMG]?) samples/s")
SCALE = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}
# (what the quickstart says, what the test runs instead): each must occur exactly once
EDITS = [("%hvd_start -n 4", "%hvd_start -n 2 --launcher local --gpus none"),
         ("for epoch in range(10):", "for epoch in range(100_000):  # until Stop")]
AFTER_STOP = "%%hvd\nprint('after stop', hvd.allreduce(torch.ones(1), op=hvd.Sum).item())"


def make_notebook(path):
    """The quickstart with EDITS applied and a cell that proves the cluster answers after
    Stop in place of the accuracy cell; returns the indices of (start, allreduce, data,
    train, after-stop, stop) cells."""
    nb = nbformat.read(QUICKSTART, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    for old, new in EDITS:
        hits = [c for c in code if old in c.source]
        assert len(hits) == 1, f"quickstart changed: {old!r} found in {len(hits)} cells"
        hits[0].source = hits[0].source.replace(old, new)
    train = next(i for i, c in enumerate(code) if "hvd.report(samples=" in c.source)
    # The accuracy cell prints what a completed training run measured (samples_per_s): a
    # stopped run has none, so the cell that proves the cluster still answers replaces it.
    assert "samples_per_s" in code[train + 1].source, "quickstart's cells changed order"
    code[train + 1] = nbformat.v4.new_code_cell(AFTER_STOP)
    assert code[-1].source.strip() == "%hvd_stop", "quickstart no longer ends with %hvd_stop"
    nb.cells = code  # markdown cells are not needed to run it
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}  # no "Select Kernel" dialog
    nbformat.write(nb, str(path))
    return 0, 1, 2, train, train + 1, len(code) - 1


def wait_until(predicate, timeout, what, poll=0.5, shown=None):
    """``predicate()`` once truthy; else fails after ``timeout`` s, with ``shown()`` (what the
    page showed then) in the message."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s"
                        + (f"; the page showed:\n{shown()}" if shown else ""))
        time.sleep(poll)


class Notebook:
    """The visible notebook panel of the page."""

    def __init__(self, page):
        self.page = page
        self.panel = page.locator(".jp-NotebookPanel:visible")

    def cell(self, i):
        return self.panel.locator(".jp-CodeCell").nth(i)

    def run(self, i, tries=3):
        """Shift+Enter on cell ``i``; again if the kernel did not take it (the prompt stays
        ``[ ]:``, as happens right after the kernel connected)."""
        prompt = self.cell(i).locator(".jp-InputPrompt")
        for _ in range(tries):
            prompt.click()
            self.page.keyboard.press("Shift+Enter")
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                if prompt.inner_text().strip() not in ("[ ]:", ""):
                    return
                time.sleep(0.25)
        raise AssertionError(f"cell {i} did not start after {tries} Shift+Enter")

    def output(self, i):
        return self.cell(i).locator(".jp-OutputArea").inner_text()

    def rates(self):
        """{rank: samples/s} read from the dashboard's rows."""
        self.panel.locator(".hvd-dashboard").scroll_into_view_if_needed()
        out = {}
        for row in self.panel.locator(".hvd-dashboard .hvd-row").all():
            m = RATE.search(row.locator(".hvd-rate").inner_text())
            if m:
                out[int(row.get_attribute("data-rank"))] = float(m.group(1)) * SCALE[m.group(2)]
        return out


@pytest.fixture
def page(browser_page, artifacts):
    """The browser page; on failure a screenshot (``failure.png``) and the notebook's text
    are kept as artifacts (a passing run removes those of an earlier failure)."""
    for name in ("failure.png", "failure.txt"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(artifacts, name))
    yield browser_page
    if getattr(browser_page, "_hvd_failed", True):
        try:
            browser_page.screenshot(path=os.path.join(artifacts, "failure.png"), full_page=True)
            text = browser_page.locator(".jp-NotebookPanel:visible").inner_text(timeout=5000)
            with open(os.path.join(artifacts, "failure.txt"), "w") as f:
                f.write(text)
        except Exception as exc:  # the page itself may be gone
            print(f"no failure artifacts: {exc}")


def test_quickstart_dashboard_in_jupyterlab(lab, page, artifacts):
    url, root, _ = lab
    start, allreduce, data, train, after_stop, stop = make_notebook(root / "quickstart.ipynb")
    page.goto(f"{url}/lab/workspaces/hvdtest/tree/quickstart.ipynb?reset", timeout=120_000)
    page.wait_for_selector(".jp-NotebookPanel:visible .jp-CodeCell", timeout=120_000)
    nb = Notebook(page)
    wait_until(lambda: "Idle" in str(page.locator(".jp-StatusBar-Widget").all_inner_texts()),
               120, "the kernel to be idle")

    nb.run(start)
    rows = nb.panel.locator(".hvd-dashboard .hvd-row")
    # Each rank's first snapshot arrives on its own: wait for both, not just the last row.
    wait_until(lambda: rows.count() == 2 and all("idle" in rows.nth(i).inner_text()
                                                 for i in range(2)), 120,
               "a dashboard row per rank")
    assert "cpu" in rows.nth(0).inner_text()
    nb.run(allreduce)
    wait_until(lambda: "sum over ranks: [1.0, 1.0, 1.0]" in nb.output(allreduce), 120,
               "the allreduce cell", shown=lambda: nb.output(allreduce))
    nb.run(data)
    wait_until(lambda: "training samples" in nb.output(data), 120, "the data cell",
               shown=lambda: nb.output(data))

    nb.run(train)
    seen = {0: [], 1: []}

    def sample():
        for rank, value in nb.rates().items():
            seen[rank].append(value)
        return all(len({v for v in values if v > 0}) >= 3 for values in seen.values())

    wait_until(sample, 120, "a non-zero, changing samples/s on every row", poll=1.0)
    assert re.search(r"running|in allreduce", rows.nth(0).inner_text())
    dashboard = nb.panel.locator(".hvd-dashboard")
    dashboard.locator("button", has_text="Start timeline").click()  # acts during the cell
    wait_until(lambda: "timeline: recording to" in dashboard.inner_text(), 30,
               "the timeline button's answer", shown=dashboard.inner_text)
    dashboard.locator("button", has_text="Autotune on").click()
    wait_until(lambda: re.search(r"autotune (warmup|bayes|categorical|done) ",
                                 dashboard.inner_text()), 30, "the autotune panel",
               shown=dashboard.inner_text)
    training_png = os.path.join(artifacts, "dashboard-training.png")
    dashboard.screenshot(path=training_png)
    if dashboard_picture.refresh(training_png):
        print(f"the dashboard's look changed: {dashboard_picture.PICTURE} replaced; commit it")
    with open(os.path.join(artifacts, "rates.json"), "w") as f:
        json.dump(seen, f)

    assert "epoch" in nb.output(train) and "interrupted" not in nb.output(train)
    t0 = time.monotonic()
    dashboard.locator("button[title='interrupt every rank']").click()  # Stop
    text = wait_until(lambda: "interrupted" in nb.output(train) and nb.output(train), 60,
                      "the Stop button to end the training cell")
    assert "cell interrupted (stop button)" in text, text
    assert time.monotonic() - t0 < 45
    dashboard.screenshot(path=os.path.join(artifacts, "dashboard-after-stop.png"))

    nb.run(after_stop)
    wait_until(lambda: "after stop 2.0" in nb.output(after_stop), 120, "the cell after Stop",
               shown=lambda: nb.output(after_stop))
    page.screenshot(path=os.path.join(artifacts, "notebook-after-stop.png"))

    nb.run(stop)
    wait_until(lambda: "cluster stopped" in nb.output(stop), 120, "%hvd_stop",
               shown=lambda: nb.output(stop))
    dashboard.scroll_into_view_if_needed()  # as a user would look at it
    wait_until(lambda: "cluster stopped" in dashboard.inner_text(), 30,
               "the dashboard saying the cluster stopped")
    page._hvd_failed = False
