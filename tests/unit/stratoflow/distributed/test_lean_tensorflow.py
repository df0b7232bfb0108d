"""A cluster member imports TensorFlow without Keras's optional integrations; Keras still trains.

Run in a fresh interpreter, as a member starts: the pytest process imported TensorFlow long ago.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # a fresh TensorFlow import: about 7 s of CPU

MEMBER_PROGRAM = """
import json, sys
from stratoflow.distributed.lean_tensorflow import SKIPPED_BY_KERAS, import_tensorflow

tf = import_tensorflow()
loaded = sorted(name for name in SKIPPED_BY_KERAS if name in sys.modules)
import keras

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
data = tf.data.Dataset.from_tensor_slices(([[1.0, 2.0]] * 32, [[1.0]] * 32)).batch(8).repeat()
losses = model.fit(data, steps_per_epoch=4, epochs=3, verbose=0).history["loss"]
import pandas  # a model's own code may still use it

print(json.dumps({"loaded": loaded, "losses": losses, "pandas": pandas.__name__}))
"""


def test_a_member_imports_tensorflow_without_sklearn_pandas_or_matplotlib_and_keras_trains():
    shown = subprocess.run(
        [sys.executable, "-c", MEMBER_PROGRAM], capture_output=True, text=True, timeout=300
    )
    assert shown.returncode == 0, shown.stderr[-3000:]
    result = json.loads(shown.stdout.strip().splitlines()[-1])
    assert result["loaded"] == [], f"imported with TensorFlow: {result['loaded']}"
    assert result["losses"][-1] < result["losses"][0], result["losses"]
    assert result["pandas"] == "pandas"
