"""The training host's samples: taken by the chief (`stratoflow.training.host_samples`) and logged
by the task into a real run of the session's SQLite store (`stratoflow.tracking.system_metrics`)."""

from __future__ import annotations

import time
import uuid

import numpy as np


def test_the_host_is_sampled_every_2_s_by_default_and_a_retry_continues_the_steps(monkeypatch):
    """The product's own default, as the chief samples: MLflow's variable unset, `sampled`
    around 6 s of work sends a sample about every 2 s while the work runs and one as it ends;
    logged, they are `system/...` points at the times they were taken, one step each, and a
    second attempt's logger goes on from the last step."""
    from stratoflow.tracking import mlflow_runs, system_metrics
    from stratoflow.training import host_samples

    monkeypatch.delenv(system_metrics.INTERVAL_ENV, raising=False)
    samples: list[dict] = []
    with host_samples.sampled(system_metrics.sampling_seconds(), samples.append):
        time.sleep(6.0)
        working_until = time.time()
    during = [sample["time"] for sample in samples if sample["time"] < working_until]
    assert 2 <= len(during) <= 3, (during, working_until)
    assert all(1.5 <= gap <= 3.5 for gap in np.diff(during)), during
    # The last one was taken as the block ended (after its work), not an interval later.
    assert working_until <= samples[-1]["time"] < working_until + 1.0, samples[-1]

    client = mlflow_runs.client()
    run_id = client.create_run(client.create_experiment(f"sampling-{uuid.uuid4().hex}")).info.run_id
    first_attempt = system_metrics.SystemMetricsLogger(client, run_id)
    for sample in samples:
        first_attempt(sample)
    system_metrics.SystemMetricsLogger(client, run_id)(samples[-1])  # a retried attempt's
    cpu = client.get_metric_history(run_id, "system/cpu_utilization_percentage")
    memory = client.get_metric_history(run_id, "system/system_memory_usage_megabytes")
    assert [m.step for m in sorted(cpu, key=lambda m: m.step)] == list(range(len(samples) + 1))
    assert sorted(m.timestamp for m in cpu)[: len(samples)] == [
        int(sample["time"] * 1000) for sample in samples
    ]
    assert all(0 <= m.value <= 100 for m in cpu)
    assert all(m.value > 100 for m in memory)  # megabytes used by a real host
    names = {key for key in client.get_run(run_id).data.metrics}
    assert {
        "system/disk_usage_percentage",
        "system/network_receive_megabytes",
        "system/system_memory_usage_percentage",
    } <= names
