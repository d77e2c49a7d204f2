"""deploy/ and docker-compose.yml agree with the settings the code reads.

app/settings.py is the one source of names and defaults: every environment
variable set in the Compose file, the Kubernetes manifests and the Dockerfiles is
a setting and parses as one; the ports exposed, probed and scraped are the
settings' defaults; topics are created by the code (``kernelstream topics``) and
the topic table in docs/concepts.md is the code's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kernelstream.app.kafka.topics import topics_markdown
from kernelstream.app.settings import Settings

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
DEFAULTS = Settings.model_construct()  # the defaults, whatever the environment says


def env_names() -> dict[str, str]:
    """Environment name -> settings field, derived from the model."""
    names = {f"KERNELSTREAM_{f.upper()}": f for f in Settings.model_fields}
    names["KAFKA_BOOTSTRAP"] = "bootstrap"
    return names


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text()))


def manifests() -> list[dict[str, Any]]:
    return [
        d
        for p in sorted((DEPLOY / "k8s").glob("*.yaml"))
        if p.name != "kustomization.yaml"
        for d in yaml.safe_load_all(p.read_text())
        if d
    ]


def containers() -> list[dict[str, Any]]:
    out = []
    for d in manifests():
        spec = d.get("spec", {}).get("template", {}).get("spec", {})
        out += spec.get("containers", [])
    return out


def deploy_env() -> list[tuple[str, str, str | None]]:
    """(where, name, value or None) of every variable the deploy files set."""
    found: list[tuple[str, str, str | None]] = []
    for name, svc in compose()["services"].items():
        for k, v in (svc.get("environment") or {}).items():
            found.append((f"compose {name}", k, str(v)))
    for d in manifests():
        if d["kind"] in ("ConfigMap", "Secret") and d["metadata"]["name"] != (
            "kernelstream-prometheus"
        ):
            for k, v in {**d.get("data", {}), **d.get("stringData", {})}.items():
                if k.isupper():
                    found.append((f"k8s {d['metadata']['name']}", k, str(v)))
    for c in containers():
        for e in c.get("env", []):
            found.append((f"k8s {c['name']}", e["name"], e.get("value")))
    for df in DEPLOY.glob("Dockerfile.*"):
        for line in re.findall(r"^ENV (.*(?:\\\n.*)*)", df.read_text(), re.M):
            for k, v in re.findall(r"(\w+)=(\S+)", line.replace("\\\n", " ")):
                found.append((df.name, k, v))
    return found


def test_every_kernelstream_variable_is_a_setting_and_parses() -> None:
    names = env_names()
    for where, name, value in deploy_env():
        if not name.startswith(("KERNELSTREAM_", "KAFKA_BOOTSTRAP")):
            continue  # Kafka's, Grafana's, Python's and pip's own variables
        assert name in names, f"{where}: {name} is not a setting of app/settings.py"
        if value is not None:
            field = names[name]
            extra = {"sasl_mechanism": "PLAIN", "sasl_username": "u", "sasl_password": "p"}
            extra = extra if field == "security_protocol" and value.startswith("SASL") else {}
            # Any: fields named at run time (mypy would match a str dict against
            # BaseSettings' own typed _-prefixed keyword arguments)
            kwargs: dict[str, Any] = {"bootstrap": "k:9092", **extra, field: value}
            Settings(**kwargs)  # raises unless it parses


def test_partitions_agree_between_compose_and_kubernetes() -> None:
    values = {v for _, n, v in deploy_env() if n == "KERNELSTREAM_PARTITIONS"}
    assert values == {str(DEFAULTS.partitions)}


def test_ports_are_the_settings_defaults() -> None:
    web, node = DEFAULTS.web_port, DEFAULTS.node_metrics_port
    worker_df = (DEPLOY / "Dockerfile.worker").read_text()
    node_df = (DEPLOY / "Dockerfile.node").read_text()
    assert re.search(rf"^EXPOSE {web} {node}$", worker_df, re.M)
    assert re.search(rf"^EXPOSE {node}$", node_df, re.M)
    assert f"127.0.0.1:{web}/healthz" in worker_df and f"127.0.0.1:{node}/healthz" in node_df
    services = compose()["services"]
    assert services["worker"]["expose"] == [str(web)]
    for name in ("node-gpu", "node-sim-a100", "node-sim-h100"):
        assert services[name]["expose"] == [str(node)]
    ports = {c["name"]: [p["containerPort"] for p in c.get("ports", [])] for c in containers()}
    assert ports["worker"] == [web] and ports["node"] == [node]
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    scraped = {j["job_name"]: j["dns_sd_configs"][0]["port"] for j in prom["scrape_configs"]}
    assert scraped == {"kernelstream-worker": web, "kernelstream-node": node}
    k8s_prom = next(d for d in manifests() if d["metadata"]["name"] == "kernelstream-prometheus")
    assert f'regex: "{web}"' in k8s_prom["data"]["prometheus.yml"]
    assert f'regex: "{node}"' in k8s_prom["data"]["prometheus.yml"]


def test_probes_use_the_health_endpoints() -> None:
    for c in containers():
        if c["name"] in ("worker", "node"):
            assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
            assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_node_id_is_the_kubernetes_node_name() -> None:
    node = next(c for c in containers() if c["name"] == "node")
    env = {e["name"]: e for e in node["env"]}
    assert env["KERNELSTREAM_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert node["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_credentials_only_in_secrets() -> None:
    secret_settings = {"KERNELSTREAM_SASL_PASSWORD", "KERNELSTREAM_SSL_PASSWORD"}
    secret_settings |= {"KERNELSTREAM_SIGNING_PRIVATE_KEY", "KERNELSTREAM_SASL_USERNAME"}
    for d in manifests():
        if d["kind"] == "ConfigMap":
            assert not secret_settings & set(d.get("data", {})), d["metadata"]["name"]


def test_workers_and_nodes_are_principals_of_their_own() -> None:
    """Each kind of pod gets its own Kafka credentials, so the cluster's ACLs can keep
    nodes from writing recommendations (app/kafka/acls.py); the topics job creates topics
    as a worker does."""

    def secrets_of(name: str) -> set[str]:
        c = next(c for c in containers() if c["name"] == name)
        return {e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e}

    worker, node = secrets_of("worker"), secrets_of("node")
    assert worker and node and not worker & node
    assert secrets_of("topics") == worker
    users = {
        d["metadata"]["name"]: d["stringData"]["KERNELSTREAM_SASL_USERNAME"]
        for d in manifests()
        if d["kind"] == "Secret" and "KERNELSTREAM_SASL_USERNAME" in d.get("stringData", {})
    }
    assert {users[s] for s in worker}.isdisjoint(users[s] for s in node)


def test_topics_created_by_the_code() -> None:
    services = compose()["services"]
    assert services["topics"]["command"] == ["topics"]
    job = next(d for d in manifests() if d["kind"] == "Job" and "topics" in d["metadata"]["name"])
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["topics"]


def test_docs_topic_table_is_the_codes() -> None:
    concepts = (ROOT / "docs" / "concepts.md").read_text()
    assert topics_markdown(DEFAULTS) in concepts, "run `kernelstream topics --table`"


def test_signing_keys_are_set_up_by_the_deployments_themselves() -> None:
    """Compose and Kubernetes make the pair with ``kernelstream keygen``; workers get the
    private key, nodes only the public one."""
    services = compose()["services"]
    assert services["keys"]["command"][0] == "keygen"
    for name, svc in services.items():
        env = svc.get("environment", {})
        env = env if isinstance(env, dict) else {}
        if svc.get("command") == ["worker"]:
            assert "KERNELSTREAM_SIGNING_PRIVATE_KEY_FILE" in env, name
            assert any("signing-private" in v for v in svc["volumes"]), name
        if "KERNELSTREAM_NODE_ID" in env:
            assert "KERNELSTREAM_SIGNING_PUBLIC_KEY_FILE" in env, name
            assert not any("signing-private" in v for v in svc["volumes"]), name
    job = next(d for d in manifests() if d["kind"] == "Job" and "signing" in d["metadata"]["name"])
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args == ["keygen", "--k8s-secret", "kernelstream-signing"]
    assert not any(d["kind"] == "Secret" and d["metadata"]["name"] == args[2] for d in manifests())


def test_endpoints_bind_every_interface_only_where_the_deployment_says_so() -> None:
    services = compose()["services"]
    assert services["worker"]["environment"]["KERNELSTREAM_WEB_BIND"] == "0.0.0.0"
    config = next(d for d in manifests() if d["metadata"]["name"] == "kernelstream-config")
    assert config["data"]["KERNELSTREAM_WEB_BIND"] == "0.0.0.0"
    assert config["data"]["KERNELSTREAM_NODE_METRICS_BIND"] == "0.0.0.0"
