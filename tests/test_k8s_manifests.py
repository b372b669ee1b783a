"""k8s/ manifests, offline: they parse, the RayService fits KubeRay's CRD schema (unknown fields rejected, as
`kubectl apply --validate=strict` would), built-in kinds and the pod templates fit Kubernetes' own schemas
(kubernetes-validate's bundled ones), every Ray container authenticates with the token Secret, and the
NetworkPolicies open nothing but the serve ports beyond the Ray pods and the KubeRay operator.

The CRD comes from ../shared/kuberay/ray.io_rayservices.yaml or $RADIXSERVE_RAYSERVICE_CRD.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
CRD_ENV = "RADIXSERVE_RAYSERVICE_CRD"
CRD_PATH = Path(os.environ.get(CRD_ENV) or Path(__file__).resolve().parents[2] / "shared" / "kuberay"
                / "ray.io_rayservices.yaml")
# The oldest Kubernetes minor still in the big clouds' extended support among kubernetes-validate's bundled schemas
# (1.25-1.37): validating against it catches fields that newer clusters accept and older ones drop.
K8S_VERSION = "1.30"
MANIFESTS = ("rayservice.yaml", "networkpolicy.yaml", "pvc.yaml", "secrets.example.yaml", "kustomization.yaml",
             "kustomizeconfig.yaml")
RAY_POD_LABELS = {"app.kubernetes.io/name": "radixserve"}
OPERATOR_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}
AUTH_TOKEN_KEY = "auth_token"  # the Secret key KubeRay's authOptions.secretName expects


def load_all(name: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]


def rayservice() -> dict[str, Any]:
    (doc,) = load_all("rayservice.yaml")
    return doc


def serve_config_v2(rs: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(rs["spec"]["serveConfigV2"])


def pod_templates(rs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Group name ("head" or a worker groupName) -> pod template."""
    cluster = rs["spec"]["rayClusterConfig"]
    return {"head": cluster["headGroupSpec"]["template"],
            **{g["groupName"]: g["template"] for g in cluster["workerGroupSpecs"]}}


def ray_containers(rs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every container and init container of the head and worker pod templates, by "group/container"."""
    return {f"{group}/{c['name']}": c for group, tpl in pod_templates(rs).items()
            for c in tpl["spec"]["containers"] + tpl["spec"].get("initContainers", [])}


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


# --- parsing -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", MANIFESTS)
def test_manifest_parses(name):
    docs = load_all(name)
    assert docs and all(isinstance(d, dict) for d in docs), f"k8s/{name}: expected YAML mappings"


def test_k8s_dir_has_only_known_yaml():
    found = sorted(p.name for p in K8S.glob("*.yaml"))
    assert found == sorted(MANIFESTS), "a new k8s/*.yaml must be added to MANIFESTS (and so to these checks)"


def test_serve_config_v2_is_a_yaml_mapping():
    assert isinstance(serve_config_v2(rayservice()), dict)


# --- the RayService against the CRD ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def crd_schema() -> dict[str, Any]:
    if not CRD_PATH.is_file():
        pytest.skip(f"RayService CRD not found at {CRD_PATH}; set ${CRD_ENV} to a copy of KubeRay's "
                    "config/crd/bases/ray.io_rayservices.yaml to validate k8s/rayservice.yaml against it")
    crd = yaml.load(CRD_PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # 1 MB of YAML
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return v1["schema"]["openAPIV3Schema"]


def unknown_fields(data: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths of keys a structural schema does not declare (the API server prunes those silently)."""
    if isinstance(data, list) and "items" in schema:
        return [p for i, item in enumerate(data) for p in unknown_fields(item, schema["items"], f"{path}[{i}]")]
    if not isinstance(data, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    props, extra = schema.get("properties"), schema.get("additionalProperties")
    if props is None:
        return [p for k, v in data.items() for p in unknown_fields(v, extra, f"{path}.{k}")] \
            if isinstance(extra, dict) else []
    found = [f"{path}.{k}" for k in data if k not in props]
    return found + [p for k, v in data.items() if k in props for p in unknown_fields(v, props[k], f"{path}.{k}")]


def test_rayservice_validates_against_crd(crd_schema):
    errors = sorted(jsonschema.Draft7Validator(crd_schema).iter_errors(rayservice()), key=str)
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_rayservice_has_no_fields_unknown_to_crd(crd_schema):
    assert unknown_fields(rayservice(), crd_schema) == []


def test_unknown_field_check_catches_a_typo(crd_schema):
    rs = rayservice()
    rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplica"] = 4
    rs["spec"]["upgradeStrategy"]["typ"] = "NewCluster"
    assert sorted(unknown_fields(rs, crd_schema)) == [".spec.rayClusterConfig.workerGroupSpecs[0].maxReplica",
                                                      ".spec.upgradeStrategy.typ"]


def test_crd_schema_catches_a_wrong_type(crd_schema):
    rs = rayservice()
    rs["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"]["num-gpus"] = 0
    (error,) = jsonschema.Draft7Validator(crd_schema).iter_errors(rs)
    assert list(error.path) == ["spec", "rayClusterConfig", "headGroupSpec", "rayStartParams", "num-gpus"]


# --- built-in kinds and the pod templates against Kubernetes' schemas ----------------------------------------------

def k8s_validate(obj: dict[str, Any]) -> None:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{obj['kind']}/{obj['metadata'].get('name')}: {'.'.join(map(str, e.path))}: {e.message}")


@pytest.mark.parametrize("name", ["networkpolicy.yaml", "pvc.yaml", "secrets.example.yaml"])
def test_builtin_kinds_validate(name):
    for obj in load_all(name):
        k8s_validate(obj)


def test_pod_templates_and_metadata_validate():
    rs = rayservice()
    for group, template in pod_templates(rs).items():
        k8s_validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {**rs["metadata"], "name": group},
                      "template": template})


def test_kubernetes_validate_rejects_an_unknown_pod_field():
    template = copy.deepcopy(pod_templates(rayservice())["gpu"])
    template["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "gpu"},
                                      "template": template}, K8S_VERSION, strict=True)


# --- Ray token authentication -------------------------------------------------------------------------------------

def auth_problems(rs: dict[str, Any]) -> list[str]:
    """Why some Ray container would start without token auth from the Secret KubeRay also uses."""
    cluster = rs["spec"]["rayClusterConfig"]
    auth = cluster.get("authOptions", {})
    problems = [] if auth.get("mode") == "token" and auth.get("secretName") else \
        [f"authOptions must be mode: token with a secretName, got {auth}"]
    want_ref = {"name": auth.get("secretName"), "key": AUTH_TOKEN_KEY}
    for where, container in ray_containers(rs).items():
        env = env_of(container)
        if env.get("RAY_AUTH_MODE", {}).get("value") != "token":
            problems.append(f"{where}: RAY_AUTH_MODE must be 'token'")
        ref = env.get("RAY_AUTH_TOKEN", {}).get("valueFrom", {}).get("secretKeyRef")
        if ref != want_ref:
            problems.append(f"{where}: RAY_AUTH_TOKEN must come from secretKeyRef {want_ref}, got {ref}")
    return problems


def test_every_ray_container_has_token_auth_from_the_secret():
    rs = rayservice()
    assert set(ray_containers(rs)) == {"head/ray-head", "gpu/ray-worker"}
    assert auth_problems(rs) == []


def test_auth_check_catches_a_worker_without_the_token():
    rs = rayservice()
    worker = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["env"] = [e for e in worker["env"] if e["name"] != "RAY_AUTH_TOKEN"]
    assert auth_problems(rs) == ["gpu/ray-worker: RAY_AUTH_TOKEN must come from secretKeyRef "
                                 "{'name': 'radixserve-ray-auth', 'key': 'auth_token'}, got None"]


def secret_refs(rs: dict[str, Any]) -> set[tuple[str, str]]:
    """(Secret name, key) pairs the RayService reads: auth token, env vars, secret volumes."""
    auth = rs["spec"]["rayClusterConfig"]["authOptions"]
    refs = {(auth["secretName"], AUTH_TOKEN_KEY)}
    refs |= {(e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
             for c in ray_containers(rs).values() for e in c.get("env", []) if "secretKeyRef" in e.get("valueFrom", {})}
    refs |= {(v["secret"]["secretName"], item["key"]) for tpl in pod_templates(rs).values()
             for v in tpl["spec"].get("volumes", []) if "secret" in v for item in v["secret"]["items"]}
    return refs


def test_rayservice_secrets_exist_in_the_template_with_placeholders_only():
    secrets = {s["metadata"]["name"]: s["stringData"] for s in load_all("secrets.example.yaml")}
    refs = secret_refs(rayservice())
    assert refs == {("radixserve-ray-auth", "auth_token"), ("radixserve-api-keys", "api-keys")}
    for name, key in refs:
        assert key in secrets.get(name, {}), f"k8s/secrets.example.yaml lacks Secret {name} key {key}"
    for name, data in secrets.items():
        for key, value in data.items():
            assert all("REPLACE_ME" in line for line in value.splitlines()), \
                f"{name}.{key}: the template holds placeholders only (REPLACE_ME...), never real values"


def test_kustomization_does_not_apply_the_secret_template():
    (kustomization,) = load_all("kustomization.yaml")
    assert "secrets.example.yaml" not in kustomization["resources"]


# --- network policy ------------------------------------------------------------------------------------------------

def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"only matchLabels selectors are understood here, got {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def exposure(policies: list[dict[str, Any]], pod_labels: dict[str, str]) -> dict[str, set[int | None]]:
    """Who may reach pods with `pod_labels`: "ray-pods", "operator" or "anyone" -> ports (None: every port)."""
    reach: dict[str, set[int | None]] = {}
    for policy in policies:
        spec = policy["spec"]
        if not selects(spec["podSelector"], pod_labels) or "Ingress" not in spec["policyTypes"]:
            continue
        for rule in spec.get("ingress", []):
            for port in rule.get("ports", []):
                assert isinstance(port["port"], int) and "endPort" not in port, f"only single numbered ports: {port}"
            ports = {p["port"] for p in rule.get("ports", [])} or {None}
            for peer in rule.get("from") or [None]:
                reach.setdefault(peer_kind(peer), set()).update(ports)
    return reach


def peer_kind(peer: dict[str, Any] | None) -> str:
    """Which source a NetworkPolicy peer admits: the Ray pods, the KubeRay operator, or anyone else."""
    if peer is not None and peer == {"podSelector": {"matchLabels": RAY_POD_LABELS}}:
        return "ray-pods"
    if peer is not None and peer.get("podSelector") == {"matchLabels": OPERATOR_LABELS}:
        return "operator"
    return "anyone"


def serve_ports() -> set[int]:
    config = serve_config_v2(rayservice())
    return {config["http_options"]["port"], config["grpc_options"]["port"]}


def test_policies_select_every_ray_pod():
    policies = load_all("networkpolicy.yaml")
    for group, template in pod_templates(rayservice()).items():
        labels = template["metadata"]["labels"]
        assert selects(policies[0]["spec"]["podSelector"], labels), f"{group} pods are not covered"


@pytest.mark.parametrize("group", ["head", "gpu"])
def test_network_policy_opens_only_the_serve_ports(group):
    labels = pod_templates(rayservice())[group]["metadata"]["labels"]
    reach = exposure(load_all("networkpolicy.yaml"), labels)
    want = {"ray-pods": {None}, "anyone": serve_ports()}
    if group == "head":
        want["operator"] = {8265}
    assert reach == want


def test_network_policy_check_catches_an_exposed_dashboard():
    policies = load_all("networkpolicy.yaml")
    policies[0]["spec"]["ingress"][1]["ports"].append({"protocol": "TCP", "port": 8265})
    labels = pod_templates(rayservice())["head"]["metadata"]["labels"]
    assert exposure(policies, labels)["anyone"] == serve_ports() | {8265}


# --- pods: ports, GPUs, volumes ------------------------------------------------------------------------------------

def test_serve_ports_are_named_for_the_serve_service():
    rs = rayservice()
    config = serve_config_v2(rs)
    want = {"serve": config["http_options"]["port"], "serve-grpc": config["grpc_options"]["port"]}
    for where, container in ray_containers(rs).items():
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        assert {name: ports.get(name) for name in want} == want, where


def test_head_serves_no_model_and_workers_take_one_gpu_each():
    cluster = rayservice()["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0" and head["rayStartParams"]["num-cpus"] == "0"
    assert "nvidia.com/gpu" not in str(head["template"]["spec"]["containers"][0]["resources"])
    assert cluster["enableInTreeAutoscaling"] is True
    (group,) = cluster["workerGroupSpecs"]
    resources = group["template"]["spec"]["containers"][0]["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "1"
    assert group["minReplicas"] in (0, 1) and group["maxReplicas"] > group["minReplicas"]
    assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


def test_model_cache_pvc_is_mounted_at_hf_home_and_model_comes_from_the_configmap():
    (pvc,) = load_all("pvc.yaml")
    rs = rayservice()
    worker = pod_templates(rs)["gpu"]["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in worker["volumes"]
              if "persistentVolumeClaim" in v}
    container = worker["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    (volume,) = [name for name, claim in claims.items() if claim == pvc["metadata"]["name"]]
    assert env_of(container)["HF_HOME"]["value"].startswith(mounts[volume] + "/")
    for where, c in ray_containers(rs).items():
        ref = env_of(c).get("RADIXSERVE_MODEL", {}).get("valueFrom", {}).get("configMapKeyRef")
        assert ref == {"name": "radixserve-model", "key": "RADIXSERVE_MODEL"}, where


# --- kustomize -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed; `kubectl kustomize k8s/` renders the kustomization offline")
    out = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_kustomize_renders_every_object_and_the_hashed_model_configmap(rendered):
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in rendered)
    (configmap,) = [d for d in rendered if d["kind"] == "ConfigMap"]
    name = configmap["metadata"]["name"]
    assert name.startswith("radixserve-model-") and kinds == sorted([
        ("ConfigMap", name), ("PersistentVolumeClaim", "radixserve-model-cache"),
        ("NetworkPolicy", "radixserve-ray-pods"), ("NetworkPolicy", "radixserve-operator-to-dashboard"),
        ("RayService", "radixserve")])
    env_file = dict(line.split("=", 1) for line in (K8S / "model.env").read_text().splitlines() if line)
    assert configmap["data"] == env_file
    (rs,) = [d for d in rendered if d["kind"] == "RayService"]
    for where, container in ray_containers(rs).items():
        assert env_of(container)["RADIXSERVE_MODEL"]["valueFrom"]["configMapKeyRef"]["name"] == name, where
    k8s_validate(configmap)
