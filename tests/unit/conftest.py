"""Every test here may start TensorFlow in the pytest process: configure its devices first.

Two logical CPUs must be set before the first TensorFlow op of the process (`tf_runtime`); a
test that starts TensorFlow without asking for it (e.g. by listing devices) would otherwise
make the later tests' fixture fail, depending on the order the tests run in.
"""

import pytest


@pytest.fixture(autouse=True)
def _tensorflow_configured_first(tf_runtime):
    return tf_runtime
