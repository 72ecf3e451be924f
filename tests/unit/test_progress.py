"""``hvd.report`` (engine_native.progress): counters the dashboard turns into samples/s."""

import threading

import pytest

import engine_native.torch as torch_api
from engine_native import progress


@pytest.fixture(autouse=True)
def fresh():
    progress.reset()
    yield
    progress.reset()


def test_report_accumulates_samples_and_keeps_latest_extras():
    progress.report(samples=32, loss=1.5)
    progress.report(samples=32, loss=0.5, epoch=1)
    progress.report(lr=0.1)
    assert progress.totals() == (64, {"loss": 0.5, "epoch": 1, "lr": 0.1})


def test_only_the_newest_extra_keys_are_kept():
    for i in range(progress.MAX_EXTRA):
        progress.report(**{f"k{i}": i})
    progress.report(k0=100)  # refreshed: now the newest
    progress.report(fresh=1)  # one too many: the oldest (k1) goes
    _, extra = progress.totals()
    assert len(extra) == progress.MAX_EXTRA and "k1" not in extra and extra["k0"] == 100


@pytest.mark.parametrize("kwargs, error, match", [
    ({"samples": 1.5}, TypeError, r"report\(samples=...\): expected an int, got float"),
    ({"samples": True}, TypeError, "expected an int, got bool"),
    ({"samples": -1}, ValueError, "expected a count >= 0, got -1"),
    ({"loss": [1.0]}, TypeError, r"report\(loss=...\): expected a number, str or bool, got "
                                 r"list; pass float\(value\)"),
])
def test_report_rejects_bad_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        progress.report(**kwargs)
    assert progress.totals() == (0, {})


def test_reports_from_many_threads_are_all_counted():
    threads = [threading.Thread(target=lambda: [progress.report(samples=1) for _ in range(2000)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert progress.totals()[0] == 8000


def test_both_hvd_apis_expose_it():
    import engine_native

    assert engine_native.report is progress.report
    assert torch_api.report is progress.report
