"""The KubeRay `RayCluster` manifest (deploy/kuberay/raycluster.yaml) against KubeRay's own
schema, and against what stratoflow's Ray launcher and the docs promise of it.

`raycluster_v1_schema.json.gz` is the `openAPIV3Schema` of version v1 of KubeRay's CRD
(ray-project/kuberay, ray-operator/config/crd/bases/ray.io_rayclusters.yaml, commit feeaf72fa),
with its `description` fields removed; it validates as JSON Schema.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "deploy" / "kuberay" / "raycluster.yaml"
SCHEMA = Path(__file__).with_name("raycluster_v1_schema.json.gz")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return json.loads(gzip.decompress(SCHEMA.read_bytes()))


@pytest.fixture(scope="module")
def manifest() -> dict[str, Any]:
    return yaml.safe_load(MANIFEST.read_text())


def test_the_manifest_is_a_valid_raycluster(manifest, schema):
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayCluster")
    jsonschema.validate(manifest, schema)


def test_the_schema_catches_a_broken_manifest(manifest, schema):
    """The check can fail: a misspelt auth mode and a replica count as text are refused."""
    broken = json.loads(json.dumps(manifest))
    broken["spec"]["authOptions"]["mode"] = "tokens"
    with pytest.raises(jsonschema.ValidationError, match="tokens"):
        jsonschema.validate(broken, schema)
    broken = json.loads(json.dumps(manifest))
    broken["spec"]["workerGroupSpecs"][0]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError, match="two"):
        jsonschema.validate(broken, schema)


def test_the_cluster_runs_the_pinned_ray_with_token_auth_and_publishes_nothing(manifest):
    pinned = (ROOT / "pyproject.toml").read_text()
    spec = manifest["spec"]
    assert f'"ray=={spec["rayVersion"]}"' in pinned
    assert spec["authOptions"] == {"mode": "token", "secretName": "stratoflow-ray-token"}
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["include-dashboard"] == "false"
    assert head["rayStartParams"]["num-cpus"] == "0"  # members go to the worker pods
    (container,) = head["template"]["spec"]["containers"]
    # The GCS only: no dashboard (8265) and no Ray Client (10001) port.
    assert [port["containerPort"] for port in container["ports"]] == [6379]
    assert "serviceType" not in head


def test_every_pod_mounts_the_shared_run_folders_at_the_same_path(manifest):
    pods = [manifest["spec"]["headGroupSpec"]["template"]["spec"]] + [
        group["template"]["spec"] for group in manifest["spec"]["workerGroupSpecs"]
    ]
    for pod in pods:
        (container,) = pod["containers"]
        env = {item["name"]: item["value"] for item in container["env"]}
        mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
        assert env["STRATOFLOW_HOME"] in mounts
        assert env["TFDS_DATA_DIR"].startswith(env["STRATOFLOW_HOME"])
        claims = [volume["persistentVolumeClaim"]["claimName"] for volume in pod["volumes"]]
        assert claims == ["stratoflow-shared"]
