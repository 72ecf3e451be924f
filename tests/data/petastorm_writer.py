"""Write a dataset the way Petastorm's docs do (Unischema + materialize_dataset + Spark).

Runs in the Petastorm venv (benchmarks/petastorm_venv.sh), not in the project's environment:
    python petastorm_writer.py OUTPUT_DIR ROWS
Row i: id = i, vec = float32 [i, i+1, i+2, i+3] (NdarrayCodec), img = uint8 3x2 filled with
i % 256 (CompressedNdarrayCodec), label = i % 5 (ScalarCodec int32).
"""
import os
import sys

import numpy as np
from petastorm.codecs import CompressedNdarrayCodec, NdarrayCodec, ScalarCodec
from petastorm.etl.dataset_metadata import materialize_dataset
from petastorm.unischema import Unischema, UnischemaField, dict_to_spark_row
from pyspark.sql import SparkSession
from pyspark.sql.types import IntegerType, LongType

Schema = Unischema("Rows", [
    UnischemaField("id", np.int64, (), ScalarCodec(LongType()), False),
    UnischemaField("vec", np.float32, (4,), NdarrayCodec(), False),
    UnischemaField("img", np.uint8, (3, 2), CompressedNdarrayCodec(), False),
    UnischemaField("label", np.int32, (), ScalarCodec(IntegerType()), False),
])


def row(i):
    return {"id": np.int64(i), "vec": np.arange(i, i + 4, dtype=np.float32),
            "img": np.full((3, 2), i % 256, dtype=np.uint8), "label": np.int32(i % 5)}


def main(out_dir, rows):
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Spark's workers: this venv's Python too
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").getOrCreate())
    url = "file://" + out_dir
    with materialize_dataset(spark, url, Schema, row_group_size_mb=1):
        rdd = spark.sparkContext.parallelize(range(rows), 3).map(
            lambda i: dict_to_spark_row(Schema, row(i)))
        spark.createDataFrame(rdd, Schema.as_spark_schema()).write.mode("overwrite") \
            .option("parquet.block.size", 16 * 1024).parquet(url)
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
