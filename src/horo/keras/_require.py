"""The import-time check of ``horo.keras`` (importing this module runs it): Keras 3 and its backend's
framework, or an ImportError naming what to install."""

from __future__ import annotations

import os
from types import ModuleType

from ..plugins.quiet import quiet_import

__all__ = ["require_keras"]

# What provides each backend's framework. TensorFlow comes as `tensorflow` (GPU builds) or
# `tensorflow-cpu`; horo's extras leave that choice to the user, so the message names both.
_INSTALL = {
    "tensorflow": "pip install tensorflow (GPU builds; or 'horo-mpi[tensorflow]'), or pip install tensorflow-cpu on a "
                  "machine without a GPU ('horo-mpi[tensorflow-cpu]'); or train on torch: KERAS_BACKEND=torch",
    "torch": "pip install torch (or 'horo-mpi[torch]'); or set KERAS_BACKEND=tensorflow",
    "jax": "pip install jax (CPU; or 'horo-mpi[jax]'), or jax[cuda12] on GPUs; or set KERAS_BACKEND=tensorflow",
    "jaxlib": "pip install jax (CPU; or 'horo-mpi[jax]'), or jax[cuda12] on GPUs; or set KERAS_BACKEND=tensorflow",
}


def require_keras() -> ModuleType:
    """Import and return Keras 3, with its backend's framework.

    Raises:
        ImportError: Keras is missing or older than 3, or its backend's framework is missing; the message
            names the packages to install.
    """
    backend = os.environ.get("KERAS_BACKEND", "")
    try:
        with quiet_import("keras"):  # keras imports its backend's framework, TensorFlow's banners included
            import keras
    except ModuleNotFoundError as exc:
        top = (exc.name or "").split(".")[0]
        if top == "keras":
            raise ImportError(
                f"horo.keras needs Keras 3, which is not installed. Received: import keras failed ({exc}). "
                f"HINT: pip install 'horo-mpi[keras]', plus a backend: {_INSTALL['tensorflow']}."
            ) from exc
        if top in _INSTALL:
            what = "neither tensorflow nor tensorflow-cpu is" if top == "tensorflow" else f"{top} is not"
            raise ImportError(
                f"Keras's backend is {top}, but {what} installed. Received: KERAS_BACKEND="
                f"{backend or '(unset: tensorflow)'!r}. HINT: {_INSTALL[top]}."
            ) from exc
        raise
    major = keras.__version__.split(".")[0]
    if not major.isdigit() or int(major) < 3:
        raise ImportError(
            f"horo.keras needs Keras 3. Received: keras.__version__={keras.__version__!r}. "
            "HINT: pip install -U 'horo-mpi[keras]' (Keras 2 models, tf_keras, are served too: horo.keras needs "
            "Keras 3 installed next to tf_keras, as TensorFlow itself does)."
        )
    return keras


require_keras()
