"""CI validation of compose.yaml, the Dockerfile and the Kubernetes manifests (no engine runs here:
these are structural checks on the parsed documents, plus the router's own config validation)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.procs import ROOT

K8S = ROOT / "deploy" / "k8s"
TIERS = {"working": 8701, "episodic": 8702, "semantic": 8703, "procedural": 8704}
ALL = {**TIERS, "router": 8700}


def _docs() -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        out += [(path, doc) for doc in yaml.safe_load_all(path.read_text()) if doc]
    return out


def _by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in _docs() if doc["kind"] == kind}


def test_every_manifest_has_the_basic_fields() -> None:
    for path, doc in _docs():
        assert {"apiVersion", "kind"} <= set(doc), path
        if doc["kind"] == "Kustomization":
            continue
        assert doc["metadata"]["name"], path
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "a2m", (path, doc["kind"])
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])


def test_kustomization_lists_every_file() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files


def test_a_deployment_and_service_per_server_with_probes_and_resources() -> None:
    deployments, services = _by_kind("Deployment"), _by_kind("Service")
    assert set(deployments) == set(ALL) and set(services) == set(ALL)
    secrets = _by_kind("Secret")["a2m-secrets"]["stringData"]
    for name, port in ALL.items():
        spec = deployments[name]["spec"]
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        (container,) = spec["template"]["spec"]["containers"]
        assert container["args"][:2] == ["serve", name]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"http": port}
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
        requests = container["resources"]["requests"]
        assert {"cpu", "memory"} <= set(requests) and "memory" in container["resources"]["limits"]
        env = {e["name"]: e for e in container["env"]}
        assert env["A2M_PORT"]["value"] == str(port) and env["A2M_HOST"]["value"] == "0.0.0.0"
        for item in env.values():
            ref = item.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == "a2m-secrets" and ref["key"] in secrets, (name, ref)
        assert "A2M_SERVICE_TOKEN" in env  # the tiers trust only the router
        if name in TIERS and name != "procedural":
            assert f"A2M_{name.upper()}_URL" in env  # a real engine, never the embedded fallback
        mounts = {m["name"] for m in container.get("volumeMounts", [])}
        volumes = {v["name"] for v in spec["template"]["spec"].get("volumes", [])}
        assert mounts <= volumes
        service = services[name]["spec"]
        assert service["selector"].items() <= spec["template"]["metadata"]["labels"].items()
        assert service["ports"] == [{"name": "http", "port": port, "targetPort": "http"}]
        assert service.get("type", "ClusterIP") == "ClusterIP"
    procedural = deployments["procedural"]["spec"]
    assert procedural["replicas"] == 1 and procedural["strategy"]["type"] == "Recreate"
    claims = _by_kind("PersistentVolumeClaim")
    data = next(v for v in procedural["template"]["spec"]["volumes"] if v["name"] == "data")
    assert data["persistentVolumeClaim"]["claimName"] in claims


def test_hpa_for_router_and_episodic() -> None:
    hpas = _by_kind("HorizontalPodAutoscaler")
    deployments = _by_kind("Deployment")
    targets = {h["spec"]["scaleTargetRef"]["name"] for h in hpas.values()}
    assert targets == {"router", "episodic"}
    for hpa in hpas.values():
        assert hpa["apiVersion"] == "autoscaling/v2"
        ref = hpa["spec"]["scaleTargetRef"]
        assert ref["kind"] == "Deployment" and ref["name"] in deployments
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
        # CPU utilisation targets need CPU requests on the target's containers.
        (container,) = deployments[ref["name"]]["spec"]["template"]["spec"]["containers"]
        assert "cpu" in container["resources"]["requests"]


def test_router_config_is_shared_and_valid() -> None:
    text = (ROOT / "deploy" / "router.toml").read_text()
    configmap = _by_kind("ConfigMap")["a2m-router-config"]
    assert configmap["data"]["router.toml"].strip() == text.strip()
    router = _by_kind("Deployment")["router"]["spec"]["template"]["spec"]
    (container,) = router["containers"]
    assert "/etc/a2m/router.toml" in container["args"]
    config_volume = next(v for v in router["volumes"] if v["name"] == "config")
    assert config_volume["configMap"]["name"] == "a2m-router-config"
    try:
        from router.config import parse
    except ImportError:
        pytest.skip("router/ not present")
    config = parse(tomllib.loads(text), env={})
    assert {t.name: t.url for t in config.tiers} == {n: f"http://{n}:{p}/" for n, p in TIERS.items()}


def test_compose_file() -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"redis", "postgres", "qdrant", *ALL}
    assert services["postgres"]["image"].startswith("pgvector/pgvector:")
    assert services["qdrant"]["image"].startswith("qdrant/qdrant:")
    published = {name for name, s in services.items() if s.get("ports")}
    assert published == {"router"}
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        assert "container_name" not in service  # would stop --scale
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith("."):
                assert source in compose["volumes"], (name, source)  # named volumes only
    for name, port in ALL.items():
        service = services[name]
        assert service["build"] == "." and service["command"][:2] == ["serve", name]
        assert service["environment"]["A2M_PORT"] == str(port)
        assert str(port) in " ".join(service["healthcheck"]["test"]) and "/readyz" in " ".join(
            service["healthcheck"]["test"])
    urls = {n: services[n]["environment"].get(f"A2M_{n.upper()}_URL", "") for n in TIERS}
    assert urls["working"].startswith("redis://redis:")
    assert urls["episodic"].startswith("postgresql://") and "@postgres:5432/" in urls["episodic"]
    assert urls["semantic"] == "http://qdrant:6333"
    for name in ("working", "episodic", "semantic"):
        assert "volumes" not in services[name]  # stateless: `--scale` works
    assert services["router"]["ports"] == ["${A2M_PUBLISH:-127.0.0.1:8700}:8700"]
    assert "./deploy/router.toml:/etc/a2m/router.toml:ro" in services["router"]["volumes"]
    for dependency in TIERS:
        assert services["router"]["depends_on"][dependency]["condition"] == "service_healthy"


def test_dockerfile_and_dockerignore() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11", dockerfile, re.M)
    assert re.search(r"^USER \d+", dockerfile, re.M)  # not root
    assert "HEALTHCHECK" in dockerfile and "/readyz" in dockerfile
    assert 'ENTRYPOINT ["a2m"]' in dockerfile
    for package in ("a2m", "backends", "router", "a2mctl"):
        assert f"COPY {package} ./{package}" in dockerfile
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", "tests"} <= ignored
    assert not {"a2m", "backends", "router", "a2mctl", "pyproject.toml", "README.md"} & ignored
