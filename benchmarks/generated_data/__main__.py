"""`python -m benchmarks.generated_data DATA_DIR CONFIG [SHARDS]`: build one config."""

import logging
import sys

from benchmarks.generated_data.builder import build

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
build(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
