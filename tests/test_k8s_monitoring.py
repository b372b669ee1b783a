"""k8s/monitoring/, offline: the kustomization renders the dashboard ConfigMap, the PodMonitor and the NetworkPolicy;
built-in kinds fit Kubernetes' schemas; the PodMonitor fits a strict structural check of the Prometheus Operator's
monitoring.coreos.com/v1 PodMonitor API and selects every radixserve Ray pod on the port Prometheus may reach; the
Grafana dashboard's panels query only metrics that exist (radixserve's by name and type from deployments/metrics.py;
tests/test_metrics_serve.py checks on a live application that every one of them, Ray's included, is exported).

No CRD schema of the Prometheus Operator is on disk, so `POD_MONITOR` below is a hand-written structural schema of
the fields this repository uses, from the operator's API reference (PodMonitorSpec, PodMetricsEndpoint,
RelabelConfig, NamespaceSelector): unknown fields are rejected, types, patterns and required fields checked.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from deployments.metrics import EngineMetrics, IngressMetrics, RouterMetrics

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "k8s" / "monitoring"
DASHBOARD = MONITORING / "radixserve-dashboard.json"
K8S_VERSION = "1.30"  # as tests/test_k8s_manifests.py
RAY_METRICS_PORT = 8080  # KubeRay's default --metrics-export-port, its container port named "metrics"
PROMETHEUS_LABELS = {"app.kubernetes.io/name": "prometheus"}

DURATION = {"type": "string", "pattern": r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?"
                                          r"(([0-9]+)s)?(([0-9]+)ms)?)$"}
LABEL_NAME = {"type": "string", "pattern": r"^[a-zA-Z_][a-zA-Z0-9_]*$"}
STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
LABEL_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": STRING_MAP,
    "matchExpressions": {"type": "array", "items": {"type": "object", "additionalProperties": False,
                                                    "required": ["key", "operator"], "properties": {
                                                        "key": {"type": "string"},
                                                        "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
                                                        "values": {"type": "array", "items": {"type": "string"}}}}}}}
RELABEL_CONFIG = {"type": "object", "additionalProperties": False, "properties": {
    "sourceLabels": {"type": "array", "items": LABEL_NAME}, "separator": {"type": "string"},
    "targetLabel": {"type": "string"}, "regex": {"type": "string"}, "modulus": {"type": "integer"},
    "replacement": {"type": "string"},
    "action": {"enum": ["replace", "Replace", "keep", "Keep", "drop", "Drop", "hashmod", "HashMod", "labelmap",
                        "LabelMap", "labeldrop", "LabelDrop", "labelkeep", "LabelKeep", "lowercase", "Lowercase",
                        "uppercase", "Uppercase", "keepequal", "KeepEqual", "dropequal", "DropEqual"]}}}
POD_MONITOR = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PodMonitor"},
        "metadata": {"type": "object", "required": ["name"], "additionalProperties": False, "properties": {
            "name": {"type": "string"}, "namespace": {"type": "string"}, "labels": STRING_MAP,
            "annotations": STRING_MAP}},
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "podMetricsEndpoints"],
                 "properties": {
                     "jobLabel": {"type": "string"},
                     "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                     "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                         "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
                     "selector": LABEL_SELECTOR,
                     "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False, "properties": {
                             "port": {"type": "string"}, "path": {"type": "string", "pattern": "^/"},
                             "scheme": {"enum": ["http", "https"]}, "interval": DURATION, "scrapeTimeout": DURATION,
                             "honorLabels": {"type": "boolean"},
                             "relabelings": {"type": "array", "items": RELABEL_CONFIG},
                             "metricRelabelings": {"type": "array", "items": RELABEL_CONFIG}}}}}}}}


def load(name: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((MONITORING / name).read_text()) if d]
    return doc


def rayservice() -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((ROOT / "k8s" / "rayservice.yaml").read_text()) if d]
    return doc


def ray_pod_templates() -> dict[str, dict[str, Any]]:
    cluster = rayservice()["spec"]["rayClusterConfig"]
    return {"head": cluster["headGroupSpec"], **{g["groupName"]: g for g in cluster["workerGroupSpecs"]}}


def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def queried_metrics() -> set[str]:
    return {name for panel in dashboard()["panels"] for target in panel["targets"]
            for name in re.findall(r"\bray_[a-z_]+", target["expr"])}


def exported_names() -> set[str]:
    """What Ray exports for each radixserve metric: `ray_` prefix; counters `_total`; histograms their series."""
    suffixes = {"Counter": ("_total",), "Gauge": ("",), "Histogram": ("_bucket", "_count", "_sum")}
    names = set()
    for group in (IngressMetrics(), EngineMetrics(), RouterMetrics()):
        for metric in vars(group).values():
            kind = type(metric).__name__
            if kind in suffixes:
                names.update(f"ray_{metric.info['name']}{suffix}" for suffix in suffixes[kind])
    return names


def series_base(names: set[str]) -> set[str]:
    """Metric names without a histogram's series suffix."""
    return {re.sub(r"_(bucket|count|sum)$", "", name) for name in names}


def test_pod_monitor_fits_the_operator_api():
    jsonschema.validate(load("podmonitor.yaml"), POD_MONITOR)


@pytest.mark.parametrize("path, bad", [(("spec", "podMetricsEndpoints", 0, "intervall"), "15s"),
                                       (("spec", "podMetricsEndpoints", 0, "interval"), "15 seconds"),
                                       (("spec", "podMetricsEndpoints", 0, "port"), 8080)])
def test_pod_monitor_check_catches_a_typo_a_bad_duration_and_a_numbered_port(path, bad):
    monitor = load("podmonitor.yaml")
    target = monitor
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = bad
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, POD_MONITOR)


def test_pod_monitor_scrapes_every_ray_pod_on_the_metrics_port():
    spec = load("podmonitor.yaml")["spec"]
    for group, spec_of_group in ray_pod_templates().items():
        labels = spec_of_group["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items()), group
        port = spec_of_group.get("rayStartParams", {}).get("metrics-export-port", str(RAY_METRICS_PORT))
        assert int(port) == RAY_METRICS_PORT, f"{group} exports metrics on {port}; the monitoring expects 8080"
    assert [e["port"] for e in spec["podMetricsEndpoints"]] == ["metrics"]


def test_network_policy_opens_only_the_metrics_port_to_prometheus():
    policy = load("networkpolicy.yaml")
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": RAY_METRICS_PORT}]
    assert [peer["podSelector"]["matchLabels"] for peer in rule["from"]] == [PROMETHEUS_LABELS]
    assert policy["spec"]["podSelector"] == load("podmonitor.yaml")["spec"]["selector"]


def test_dashboard_panels_are_complete_and_unique():
    panels = dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all(t["expr"].strip() and t["refId"] for t in panel["targets"]), panel["title"]
    titles = " ".join(p["title"].lower() for p in panels)
    for topic in ("throughput", "latency", "errors", "tokens saved", "compression", "stage", "queue", "replicas"):
        assert topic in titles, f"no panel about {topic}"


def test_dashboard_queries_radixserve_metrics_by_their_exported_names():
    radixserve = {name for name in queried_metrics() if name.startswith("ray_radixserve_")}
    unknown = radixserve - exported_names()
    assert not unknown, f"the dashboard queries metrics deployments/metrics.py does not define as such: {unknown}"
    assert series_base(exported_names()) - series_base(radixserve) == set(), "a metric no panel shows"


def test_dashboard_name_check_catches_a_counter_without_total():
    assert "ray_radixserve_requests" not in exported_names()
    assert "ray_radixserve_requests_total" in exported_names()


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed; `kubectl kustomize k8s/monitoring/` renders the kustomization offline")
    out = subprocess.run([kubectl, "kustomize", str(MONITORING)], capture_output=True, text=True, timeout=60,
                         check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_kustomize_renders_the_dashboard_configmap_for_grafana(rendered):
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in rendered)
    assert kinds == [("ConfigMap", "radixserve-grafana-dashboard"),
                     ("NetworkPolicy", "radixserve-prometheus-to-metrics"), ("PodMonitor", "radixserve-ray")]
    (configmap,) = [d for d in rendered if d["kind"] == "ConfigMap"]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["radixserve-dashboard.json"]) == dashboard()
    kubernetes_validate.validate(configmap, K8S_VERSION, strict=True)
