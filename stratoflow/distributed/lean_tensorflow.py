"""Import TensorFlow in a cluster member without Keras's optional integrations.

`import tensorflow` imports Keras, and Keras imports scikit-learn (its estimator wrappers), pandas
(DataFrames as `fit` input) and matplotlib.pyplot (image galleries) whenever they are installed,
which MLflow's server package makes them. That is 3.4 s of the 10 s of CPU a fresh process spends
importing TensorFlow on these 2 cores (docs/BENCHMARKS.md, "Facts"), paid again by every training
process and parameter server at every start and restart. Members feed Keras `tf.data` only, so
they import TensorFlow while those three packages look absent: Keras's own fallbacks (each a
`try: import ... except ImportError`) leave its wrappers off. The packages stay importable
afterwards, by MLflow or by a model's own code; only Keras keeps its references empty.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

# Keras's optional integrations a member never uses (by top-level package).
SKIPPED_BY_KERAS = frozenset({"sklearn", "pandas", "matplotlib"})


class _LookAbsent(importlib.abc.MetaPathFinder):
    """Makes the packages in `SKIPPED_BY_KERAS` raise ModuleNotFoundError, as if not installed."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.partition(".")[0] in SKIPPED_BY_KERAS:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def import_tensorflow() -> ModuleType:
    """`import tensorflow` (and with it Keras) without Keras's optional integrations.

    A process that imported TensorFlow already gets it as it is.
    """
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    finder = _LookAbsent()
    sys.meta_path.insert(0, finder)
    try:
        # Keras first (it imports TensorFlow): its integrations load wherever it is imported.
        import keras  # noqa: F401
        import tensorflow
    finally:
        sys.meta_path.remove(finder)
    return tensorflow
