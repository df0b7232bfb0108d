"""A tiny child for the launcher tests: echoes value + 1, printing a line a second as it sleeps.

With `"announce": true` in the payload it first prints the launcher's ready marker, after
`announce_after` seconds if given; with `"exit_code"` it then exits with that status. The
launcher hands every cluster member the same payload;
`$ECHO_OVERRIDES` (JSON) changes it for one member. With `"environment_to": PATH` it writes the
environment it was started with to PATH (JSON) first. With `"reports": [[kind, data], ...]` it
reports each (`stratoflow.distributed.protocol.report`) just before it writes its result.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

payload = {
    **json.loads(Path(sys.argv[1]).read_text()),
    **json.loads(os.environ.get("ECHO_OVERRIDES", "{}")),
}
if payload.get("environment_to"):
    Path(payload["environment_to"]).write_text(json.dumps(dict(os.environ)))
if payload.get("announce"):  # tell the launcher it is up, as a cluster member does
    time.sleep(float(payload.get("announce_after", 0)))
    sys.stdout.write("STRATOFLOW-READY\n")
    sys.stdout.flush()
if payload.get("exit_code"):
    sys.exit(int(payload["exit_code"]))
for _ in range(int(payload.get("sleep", 0))):
    sys.stdout.write("still sleeping\n")
    sys.stdout.flush()
    time.sleep(1)
if payload.get("reports"):
    from stratoflow.distributed.protocol import report

    for kind, data in payload["reports"]:
        report(kind, data)
Path(sys.argv[2]).write_text(json.dumps({"value": payload.get("value", 0) + 1}))
