"""Horovod's import paths on horo: what horo leaves out of them, and the import hook that maps them.

``horovod.X`` is ``horo.X`` for every module horo has (docs/migrating.md). The hook (:func:`install`) is what the
opt-in distribution ``horo-mpi-horovod`` runs when its package ``horovod`` is imported: ``import horovod.torch``
then gives the very module object ``horo.torch``, no copy. The names and packages of Horovod 0.28.1 that horo
does not provide are listed here once, each with why and what to use; ``horo.X`` and ``horovod.X`` raise
:class:`NotProvidedError` with that text, and tests/test_horovod_names.py and docs/migrating.md read the lists.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

__all__ = ["HOROVOD_API", "NAMES", "PACKAGES", "NotProvidedError", "install", "not_provided", "package_not_provided",
           "top_level"]

#: The Horovod release whose public API horo follows (``horovod.__version__`` under the hook).
HOROVOD_API = "0.28.1"

_DATA_SERVICE = ("Horovod's tf.data service runs as a service of Horovod's own launcher, and horo has none. HINT: "
                 "shard the input per rank with `horo.tensorflow.shard_dataset`.")

#: Horovod's names (``module.name``) that horo does not provide: why, then a ``HINT:`` of what to use instead.
NAMES: dict[str, str] = {
    "horovod.common.exceptions.HorovodVersionMismatchError": (
        "Horovod raises it when its compiled framework extension was built against another framework version "
        "than the one installed; horo has no compiled extension, so nothing can mismatch. HINT: drop the "
        "`except` clause that names it."),
    "horovod.common.elastic.run_fn": (
        "it builds Horovod's per-framework elastic `run` from a reset function; horo re-forms the MPI world "
        "itself (ULFM). HINT: decorate the training function with `hvd.elastic.run` (`horo.elastic.run`, the "
        "same in every facade)."),
    "horovod.ray.BaseHorovodWorker": (
        "it is Horovod's worker actor class, and horo's workers are actors of its own. HINT: reach your code "
        "through `executable_cls` and `RayExecutor.execute`, as in Horovod."),
    "horovod.ray.ElasticRayExecutor": (
        "horo offers no elastic executor on Ray. HINT: use `horo.ray.HoroTrainer` with Ray Train's "
        "`FailureConfig`: a lost worker restarts the group, which resumes from the last reported checkpoint "
        "(docs/ray.md)."),
    "horovod.tensorflow.data.compute_service.TfDataServiceConfig": _DATA_SERVICE,
    "horovod.tensorflow.data.compute_service.tf_data_service": _DATA_SERVICE,
    "horovod.tensorflow.data.compute_service.send_to_data_service": _DATA_SERVICE,
    "horovod.tensorflow.data.compute_service.compute_worker_fn": _DATA_SERVICE,
}

_ESTIMATORS = ("Horovod's Spark estimators (`KerasEstimator`, `TorchEstimator`) have no horo counterpart. HINT: "
               "read the DataFrame's data inside the function given to `horo.spark.run` and train there "
               "(docs/spark.md).")

#: Horovod's packages and modules that horo does not provide: why, then a ``HINT:`` of what to use instead.
PACKAGES: dict[str, str] = {
    "horovod.mxnet": ("Apache MXNet is retired (moved to the Apache Attic in 2023), and horo has no MXNet facade. "
                      "HINT: port the script to PyTorch, TensorFlow, Keras or JAX (docs/migrating.md)."),
    "horovod.runner": (
        "`horovod.run(func, np=...)`, Horovod's in-Python launcher, has no horo counterpart. HINT: launch the "
        "script with `hororun`, which takes `horovodrun`'s flags."),
    "horovod.tensorflow.data.compute_service": _DATA_SERVICE,
    "horovod.tensorflow.data.compute_worker": "it is the worker script of Horovod's tf.data service. " + _DATA_SERVICE,
    "horovod.spark.keras": _ESTIMATORS,
    "horovod.spark.torch": _ESTIMATORS,
    "horovod.spark.lightning": _ESTIMATORS,
    "horovod.spark.common": _ESTIMATORS,
    "horovod.ray.elastic": NAMES["horovod.ray.ElasticRayExecutor"],
    "horovod.ray.ray_logger": ("it relays Horovod's ElasticRayExecutor's logs from rank 0 to the driver's "
                               "callbacks. HINT: with `horo.ray.HoroTrainer`, report metrics with `ray.train.report`."),
}

#: Attributes of Horovod's top-level package and the package of horo that provides each in its place.
_TOP: dict[str, str] = {"run": "horovod.runner"}


class NotProvidedError(ImportError):
    """A name or module of Horovod's that horo does not provide; the message says why and what to use.

    An ``ImportError`` (not an ``AttributeError``), so that ``from horovod.ray import ElasticRayExecutor``
    shows the message: Python replaces an ``AttributeError`` raised there with a bare "cannot import name".
    """


def _horovod_name(module: str) -> str:
    return "horovod" + module[len("horo"):] if module == "horo" or module.startswith("horo.") else module


def not_provided(module: str, name: str) -> NotProvidedError | None:
    """The error for ``name`` of ``module`` (``horo.X`` or ``horovod.X``) where Horovod has it and horo does not,
    else None: a module's ``__getattr__`` raises it, or its ordinary ``AttributeError``."""
    key = f"{_horovod_name(module)}.{name}"
    why = NAMES.get(key)
    if why is None and key in PACKAGES:
        why = PACKAGES[key]
    if why is None:
        return None
    return NotProvidedError(f"{key} is not provided by horo: {why}", name=key)


def package_not_provided(fullname: str) -> NotProvidedError | None:
    """The error for importing ``fullname`` (``horovod.X...``) where it is, or lies in, a package horo leaves
    out; else None."""
    parts = fullname.split(".")
    for i in range(len(parts), 1, -1):
        key = ".".join(parts[:i])
        if key in PACKAGES:
            return NotProvidedError(f"{fullname} is not provided by horo: {PACKAGES[key]}", name=fullname)
    return None


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``horovod.X`` as the module ``horo.X`` itself (first on ``sys.meta_path``, so that no path finder
    loads a second copy of a horo file under the ``horovod`` name)."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("horovod."):
            return None
        refused = package_not_provided(fullname)
        if refused is not None:
            raise refused
        real = "horo" + fullname[len("horovod"):]
        try:
            module = importlib.import_module(real)  # lazy: the module the script asked for, by Horovod's name
        except ModuleNotFoundError as exc:
            if exc.name != real:
                raise  # a module horo.X imports is missing (its framework): its own message names it
            raise ModuleNotFoundError(f"No module named {fullname!r}: horo has no {real}, and Horovod's module of "
                                      "that name is not part of its public API that horo provides. HINT: see "
                                      "docs/migrating.md for horo's module paths.", name=fullname) from None
        # A module of horo that is a package in Horovod with a part horo leaves out (horovod.tensorflow.data's
        # compute_service) gets an empty __path__, so that importing that part reaches this finder and says why.
        package = hasattr(module, "__path__") or any(key.startswith(fullname + ".") for key in PACKAGES)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=package,
                                              loader_state=(real, module.__spec__))

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return sys.modules[spec.loader_state[0]]

    def exec_module(self, module: ModuleType) -> None:
        # The import system has just set the alias's spec on the shared module: horo.X keeps its own.
        module.__spec__ = module.__spec__.loader_state[1]


def install() -> None:
    """Map ``horovod.X`` to ``horo.X`` in this process (once; what ``import horovod`` runs)."""
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())


def top_level(name: str) -> Exception:
    """The error for ``horovod.<name>`` that the package itself lacks (its ``__getattr__`` raises it):
    :class:`NotProvidedError` for Horovod's ``horovod.run``, else the ordinary ``AttributeError``."""
    if name in _TOP:
        return NotProvidedError(f"horovod.{name} is not provided by horo: {PACKAGES[_TOP[name]]}",
                                name=f"horovod.{name}")
    return AttributeError(f"module 'horovod' has no attribute {name!r}")
