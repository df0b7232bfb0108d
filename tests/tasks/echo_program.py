"""A tiny child for the launcher tests: echoes value + 1, printing a line a second as it sleeps."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

payload = json.loads(Path(sys.argv[1]).read_text())
for _ in range(int(payload.get("sleep", 0))):
    sys.stdout.write("still sleeping\n")
    sys.stdout.flush()
    time.sleep(1)
Path(sys.argv[2]).write_text(json.dumps({"value": payload.get("value", 0) + 1}))
