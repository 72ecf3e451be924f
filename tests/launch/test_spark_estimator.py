"""TorchEstimator on a local[2] Spark session: DataFrame → Parquet in a store → 2 ranks in
barrier mode, each reading its share → a TorchModel whose transform adds predictions."""
import os

import numpy as np
import pytest

from . import digits
from .test_spark import no_leaks  # noqa: F401 - the leak check fixture

pytestmark = [pytest.mark.spark, pytest.mark.multiproc, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def digits_df(spark):
    x, y = digits.load()
    rows = [(x[i].tolist(), int(y[i])) for i in range(len(y))]
    return spark.createDataFrame(rows, "features array<double>, label long")


def make_estimator(store, **kw):
    import torch

    from hvd_magic.spark import TorchEstimator
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 10))
    args = dict(model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.3),
                loss=torch.nn.functional.cross_entropy, feature_cols=["features"],
                label_cols=["label"], batch_size=32, epochs=6, num_proc=2, store=store,
                validation=0.2, random_seed=1, verbose=0)
    args.update(kw)
    return TorchEstimator(**args)


def accuracy(scored) -> float:
    rows = scored.select("label", "label__output").collect()
    return float(np.mean([np.argmax(r["label__output"]) == r["label"] for r in rows]))


def test_fit_then_transform(spark, digits_df, tmp_path, no_leaks):  # noqa: F811
    est = make_estimator(str(tmp_path / "store"))
    model = est.fit(digits_df)
    hist = model.history
    assert len(hist["train_loss"]) == len(hist["val_loss"]) == 6
    assert hist["val_loss"][-1] < 0.5 * hist["val_loss"][0], hist
    scored = model.transform(digits_df)
    assert scored.columns == ["features", "label", "label__output"]
    assert accuracy(scored) > 0.9
    checkpoint = est.store.load_torch(est.store.checkpoint_path(model.run_id))
    assert checkpoint["epoch"] == 5 and checkpoint["history"] == hist
    for name, value in model.getModel().state_dict().items():
        np.testing.assert_array_equal(value.numpy(), checkpoint["model"][name].numpy())
    timings = est.last_fit_timings
    assert not timings["data_reused"] and timings["train_job"] > 0


def test_data_written_once_and_reused(spark, digits_df, tmp_path, no_leaks):  # noqa: F811
    store = str(tmp_path / "store")
    first = make_estimator(store, epochs=1, validation=None)
    first.fit(digits_df)
    data_dir = os.path.join(store, "data")
    (key,) = os.listdir(data_dir)
    files = sorted(os.listdir(os.path.join(data_dir, key, "train")))
    stamps = [os.stat(os.path.join(data_dir, key, "train", f)).st_mtime_ns for f in files]
    second = make_estimator(store, epochs=1, validation=None)
    second.fit(digits_df)
    assert second.last_fit_timings["data_reused"]
    assert os.listdir(data_dir) == [key]
    assert [os.stat(os.path.join(data_dir, key, "train", f)).st_mtime_ns for f in files] == stamps
    third = make_estimator(store, epochs=1, validation=None)
    third.fit(digits_df.limit(1000))  # another plan: another dataset beside the first
    assert key in os.listdir(data_dir) and len(os.listdir(data_dir)) == 2


def test_input_shapes_feed_a_cnn(spark, digits_df, tmp_path, no_leaks):  # noqa: F811
    """Horovod's input_shapes: flat 64-value rows reach a conv net as [B, 1, 8, 8], in fit
    and in transform."""
    import torch
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(8 * 6 * 6, 10))
    est = make_estimator(str(tmp_path / "store"), model=net,
                         optimizer=torch.optim.SGD(net.parameters(), lr=0.3),
                         input_shapes=[[-1, 1, 8, 8]], epochs=8, validation=None)
    assert accuracy(est.fit(digits_df).transform(digits_df)) > 0.9


def test_vector_features(spark, tmp_path, no_leaks):  # noqa: F811
    import torch
    from pyspark.ml.feature import VectorAssembler

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=400), rng.normal(size=400)
    df = spark.createDataFrame([(float(p), float(q), float(2 * p - q)) for p, q in zip(a, b)],
                               "a double, b double, y double")
    df = VectorAssembler(inputCols=["a", "b"], outputCol="vec").transform(df)
    net = torch.nn.Linear(2, 1)
    est = make_estimator(str(tmp_path / "store"), model=net,
                         optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                         loss=torch.nn.functional.mse_loss, feature_cols=["vec"],
                         label_cols=["y"], epochs=10, validation=None)
    scored = est.fit(df).transform(df)
    assert scored.columns == ["a", "b", "y", "vec", "y__output"]
    rows = scored.collect()
    err = max(abs(r["y__output"] - r["y"]) for r in rows)
    assert err < 0.05, err


def test_bad_input_fails_before_any_rank_and_keeps_the_store(spark, digits_df, tmp_path,
                                                              no_leaks):  # noqa: F811
    store = tmp_path / "store"
    make_estimator(str(store), epochs=1, validation=None).fit(digits_df)
    before = sorted(str(p.relative_to(store)) for p in store.rglob("*"))
    bad = [
        (dict(feature_cols=["pixels"]), r"feature column 'pixels' is not in the DataFrame"),
        (dict(label_cols=["name"]), r"label column 'name' has type string"),
        (dict(validation=1.5), r"validation must be a fraction in \[0, 1\)"),
    ]
    with_name = digits_df.selectExpr("features", "label", "'x' AS name")
    for kw, match in bad:
        with pytest.raises(ValueError, match=match):
            make_estimator(str(store), **kw).fit(with_name)
    with pytest.raises(ValueError, match=r"0 training row\(s\), fewer than the 2 ranks"):
        make_estimator(str(store), validation=None).fit(digits_df.limit(0))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(PermissionError, match=r"the store .* cannot be written"):
        make_estimator(str(blocker / "store")).fit(digits_df)
    assert sorted(str(p.relative_to(store)) for p in store.rglob("*")) == before


def test_spark_estimator_notebook(no_leaks):  # noqa: F811
    """notebooks/spark_estimator.ipynb runs headless top to bottom (its own Spark session)."""
    import re

    import nbformat
    from nbclient import NotebookClient

    path = os.path.join(os.path.dirname(__file__), "..", "..", "notebooks",
                        "spark_estimator.ipynb")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=400, kernel_name="python3", allow_errors=False,
                   resources={"metadata": {"path": os.path.dirname(path)}}).execute(
                       env=dict(os.environ))
    text = "\n".join(out.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for out in c.get("outputs", []))
    found = re.search(r"test accuracy: ([0-9.]+)", text)
    assert found, text
    assert float(found.group(1)) > 0.9, text
