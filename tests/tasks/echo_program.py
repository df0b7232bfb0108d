"""A tiny child for the launcher tests: echoes value + 1, optionally printing while it sleeps."""

from __future__ import annotations

import json
import sys
import time

payload = json.load(open(sys.argv[1]))
for _ in range(int(payload.get("sleep", 0))):
    print("still sleeping", flush=True)
    time.sleep(1)
json.dump({"value": payload.get("value", 0) + 1}, open(sys.argv[2], "w"))
