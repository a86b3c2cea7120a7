"""horo on Apache Spark: Horovod's ``horovod.spark.run`` and ``run_elastic`` (docs/spark.md).

``horo.spark.run(fn, num_proc=4)`` runs ``fn`` in ``num_proc`` Spark tasks as one horo world and returns each
rank's result; ``horo.spark.run_elastic`` does the same on horo's elastic runtime, with the hosts of the Spark
executors alive.
"""

try:
    import pyspark  # noqa: F401
except ImportError as _exc:
    raise ImportError("horo.spark needs PySpark, which is not installed. HINT: pip install 'horo-mpi[spark]' (Java 17 "
                      "or newer is needed too, as for any Spark).") from _exc

from .elastic import run_elastic
from .runner import run
from .settings import TimeoutException

__all__ = ["TimeoutException", "run", "run_elastic"]
