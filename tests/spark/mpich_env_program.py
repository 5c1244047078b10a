"""Run as a script by the MPICH environment's Python (test_spark_mpich_env.py): a plain local Spark session
and hpcring.spark.run, as a user of the README's install would, with nothing borrowed or set."""

from __future__ import annotations

import json
import sys


def rank_report() -> tuple[int, int, float, str, bool]:
    import torch
    from mpi4py import MPI

    import hpcring.torch as hvd

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return hvd.rank(), hvd.size(), float(total.item()), sys.executable, "MPICH" in MPI.Get_library_version()


def main() -> None:
    from pyspark.sql import SparkSession

    import hpcring.spark

    spark = (
        SparkSession.builder.master(f"local[{sys.argv[1]}]")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.local.dir", sys.argv[2])
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        print(json.dumps(hpcring.spark.run(rank_report, num_proc=int(sys.argv[1]), start_timeout=120)))
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
