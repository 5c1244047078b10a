"""Parts of Horovod's `horovod.spark.common` over hpcring: the Store and the data preparation of the
estimators. Nothing here imports pyspark at import time."""
