"""``TorchModel``: the Spark Transformer ``TorchEstimator.fit`` returns.

``transform(df)`` runs the trained model over the DataFrame in Spark tasks (a pandas UDF,
Arrow batches) and adds one prediction column per label column: ``<label>__output`` unless
``output_cols`` says otherwise (Horovod's naming). A model output of one value per row becomes
a double column, several values an array<double> column.
"""

import numpy as np
from pyspark.ml import Model
from pyspark.sql import types as T


def _feature_array(series) -> np.ndarray:
    first = series.iloc[0] if len(series) else 0.0
    if isinstance(first, (list, tuple, np.ndarray)):
        return np.stack([np.asarray(v, dtype=np.float32) for v in series])
    return series.to_numpy(dtype=np.float32)


def _model_inputs(features, input_shapes):
    """A pandas frame of feature columns → the model's input tensors (float32, reshaped)."""
    import torch
    inputs = [torch.from_numpy(_feature_array(features.iloc[:, i]))
              for i in range(features.shape[1])]
    if input_shapes:
        inputs = [t.reshape(shape) for t, shape in zip(inputs, input_shapes)]
    return inputs


def _predictor(model, input_shapes, output_cols, widths):
    """The pandas UDF body: a struct of the feature columns (as a pandas DataFrame, one
    column per feature in order) → a struct of the predictions."""
    import pandas as pd

    def predict(features: pd.DataFrame) -> pd.DataFrame:
        import torch
        model.eval()
        with torch.no_grad():
            outputs = model(*_model_inputs(features, input_shapes))
        outputs = outputs if isinstance(outputs, (tuple, list)) else [outputs]
        columns = {}
        for name, out, width in zip(output_cols, outputs, widths):
            values = out.detach().double().reshape(len(features), -1).numpy()
            columns[name] = values[:, 0] if width == 1 else list(values)
        return pd.DataFrame(columns)
    return predict


class TorchModel(Model):
    """A trained torch model as a Spark Transformer.

    Attributes
    ----------
    model : torch.nn.Module, the trained module (on the driver).
    history : dict of per-epoch metrics (``train_loss``, ``val_loss`` with validation).
    run_id : the run's id; its checkpoint is ``store.checkpoint_path(run_id)``.
    """

    def __init__(self, model, feature_cols, label_cols, output_cols=None, history=None,
                 run_id=None, input_shapes=None):
        super().__init__()
        self.model, self.history, self.run_id = model, history or {}, run_id
        self.input_shapes = input_shapes
        self.feature_cols, self.label_cols = list(feature_cols), list(label_cols)
        self.output_cols = list(output_cols or [f"{c}__output" for c in label_cols])
        if len(self.output_cols) != len(self.label_cols):
            raise ValueError(f"TorchModel: {len(self.output_cols)} output_cols for "
                             f"{len(self.label_cols)} label_cols; give one per label column")

    def getModel(self):
        """Horovod's accessor for the trained module."""
        return self.model

    def _output_widths(self, features) -> list:
        """Values per row of each output, from one row run on the driver."""
        import torch
        row = features.limit(1).toPandas()
        if not len(row):
            return [1] * len(self.output_cols)
        self.model.eval()
        with torch.no_grad():
            out = self.model(*_model_inputs(row, self.input_shapes))
        out = out if isinstance(out, (tuple, list)) else [out]
        if len(out) != len(self.output_cols):
            raise ValueError(f"TorchModel: the model returned {len(out)} output(s) for "
                             f"{len(self.output_cols)} output column(s)")
        return [int(o.numel()) for o in out]

    def _transform(self, df):
        from pyspark.ml.functions import vector_to_array
        from pyspark.sql import functions as F
        missing = [c for c in self.feature_cols if c not in df.columns]
        if missing:
            raise ValueError(f"TorchModel.transform: feature column(s) {missing} are not in "
                             f"the DataFrame; its columns are {', '.join(df.columns)}")
        # The model's inputs in one struct (ML vectors as float arrays: Arrow has no vectors),
        # so the DataFrame's own columns pass through untouched.
        feats = F.struct(*[(vector_to_array(F.col(c), "float32")
                            if type(df.schema[c].dataType).__name__ == "VectorUDT"
                            else F.col(c)).alias(f"f{i}")
                           for i, c in enumerate(self.feature_cols)])
        widths = self._output_widths(df.select(feats.alias("x")).select("x.*"))
        out_type = T.StructType([
            T.StructField(name, T.DoubleType() if w == 1 else T.ArrayType(T.DoubleType()))
            for name, w in zip(self.output_cols, widths)])
        udf = F.pandas_udf(_predictor(self.model, self.input_shapes, self.output_cols, widths),
                           out_type)
        tmp = "__hvd_predictions"
        result = df.withColumn(tmp, udf(feats))
        return result.select(*[F.col(c) for c in df.columns],
                             *[F.col(f"{tmp}.{c}").alias(c) for c in self.output_cols])
