"""stratoflow's offline TFDS builders; importing this package registers them with TFDS.

Each builder reads real data that ships inside an installed package, so it builds on a machine
without internet. A custom `GeneratorBasedBuilder` must live in a package, hence one sub-package
per builder.
"""

from stratoflow.data.tfds_builders.stratoflow_digits import StratoflowDigits
from stratoflow.data.tfds_builders.stratoflow_mnist5k import StratoflowMnist5k

# TFDS name → builder class, for callers that need to know which datasets build offline.
BUNDLED_BUILDERS = {builder.name: builder for builder in (StratoflowMnist5k, StratoflowDigits)}

__all__ = ["BUNDLED_BUILDERS", "StratoflowDigits", "StratoflowMnist5k"]
