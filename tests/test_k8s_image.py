"""The container recipe and its versions, offline (no Docker here): the Dockerfile starts from the official Ray GPU
image of the Ray version pyproject.toml pins, with a Python that requires-python allows and the CUDA major version
of the torch build pyproject.toml pins, installs the project with its `gpu` extra; the RayService runs an image
tagged from those same versions; triton is pinned to the version the GPU torch requires, so the CPU tests run it.
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.specifiers import SpecifierSet

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10; pytest itself depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
RAY_IMAGE = re.compile(r"^rayproject/ray:(?P<ray>\d+\.\d+\.\d+)-py(?P<py>3)(?P<minor>\d+)-cu(?P<cuda>\d+)$")
# torch release -> (CUDA version, triton version) of PyPI's Linux x86-64 torch wheel, from its Requires-Dist
# (cuda-toolkit==13.0.3, triton==3.7.1). Check a new torch with bench/results/gpu/NOTES.md's `pip install --dry-run
# --report` command for the GPU platform before adding its line.
PYPI_TORCH_BUILDS = {"2.13.0": ("13.0", "3.7.1")}


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def rayservice() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "k8s" / "rayservice.yaml").read_text())


def pin(project: dict[str, Any], name: str, extra: str | None = None) -> str:
    """The exact version pyproject.toml pins `name` to (`name==X` or `name[extras]==X`), in the dependencies or in
    the optional dependencies `extra`."""
    deps = project["project"]["dependencies"] if extra is None else project["project"]["optional-dependencies"][extra]
    pattern = rf"{re.escape(name)}(?:\[[^\]]*\])?==([^;\s]+)"
    (version,) = [m[1] for dep in deps if (m := re.fullmatch(pattern, dep.strip()))]
    return version


def base_image(text: str) -> re.Match:
    froms = re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)
    assert len(froms) == 1, f"expected one FROM (a single stage), got {froms}"
    match = RAY_IMAGE.match(froms[0])
    assert match, f"base image {froms[0]} is not an official rayproject/ray:<ray>-py3<minor>-cu<cuda> GPU image"
    return match


def image_tag(project: dict[str, Any], base: re.Match) -> str:
    """The tag the radixserve image is pushed with: project version, then the base image's versions."""
    return f"{project['project']['version']}-ray{base['ray']}-py{base['py']}{base['minor']}-cu{base['cuda']}"


def image_drift(text: str, project: dict[str, Any], rs: dict[str, Any]) -> list[str]:
    """Where the Dockerfile or the RayService disagree with pyproject.toml's pins, one line each."""
    base, ray = base_image(text), pin(project, "ray")
    drift = [] if base["ray"] == ray else [f"Dockerfile base image has Ray {base['ray']}, pyproject pins {ray}"]
    python = f"3.{base['minor']}"
    if python not in SpecifierSet(project["project"]["requires-python"]):
        drift.append(f"Dockerfile Python {python} is outside requires-python {project['project']['requires-python']}")
    drift += cuda_drift(base, project)
    cluster = rs["spec"]["rayClusterConfig"]
    if cluster["rayVersion"] != ray:
        drift.append(f"RayService rayVersion {cluster['rayVersion']}, pyproject pins Ray {ray}")
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for image in {c["image"] for t in templates for c in t["spec"]["containers"]}:
        repository, _, tag = image.rpartition(":")
        if repository.rsplit("/", 1)[-1] != "radixserve" or tag != image_tag(project, base):
            drift.append(f"RayService image {image} is not radixserve:{image_tag(project, base)}")
    return drift


def cuda_drift(base: re.Match, project: dict[str, Any]) -> list[str]:
    """Where the base image's CUDA, the torch build, triton and the `gpu` extra's CUDA extras disagree."""
    torch = pin(project, "torch")
    if torch not in PYPI_TORCH_BUILDS:
        return [f"torch {torch} has no line in PYPI_TORCH_BUILDS: check its CUDA and triton requirements for the "
                f"GPU platform (bench/results/gpu/NOTES.md) and add them"]
    cuda, triton = PYPI_TORCH_BUILDS[torch]
    major = cuda.split(".")[0]
    drift = [] if base["cuda"] == cuda.replace(".", "") else [
        f"Dockerfile base image has CUDA cu{base['cuda']}, PyPI's torch {torch} is built for CUDA {cuda}"]
    if pin(project, "triton") != triton:
        drift.append(f"pyproject pins triton {pin(project, 'triton')}, PyPI's torch {torch} requires triton {triton}")
    gpu_extra = " ".join(project["project"]["optional-dependencies"]["gpu"])
    extras = set(re.findall(r"\[(?:[^\]]*,)?cu(\d+)[,\]]", gpu_extra))  # e.g. {"13"} from flash-attn-4[cu13]
    if extras != {major}:
        drift.append(f"the gpu extra's CUDA extras are cu{sorted(extras)}, torch {torch} is built for CUDA {major}")
    return drift


def test_image_versions_agree_with_pyproject():
    assert image_drift(dockerfile(), pyproject(), rayservice()) == []


def bump_ray_pin(project: dict[str, Any], rs: dict[str, Any]) -> None:
    deps = project["project"]["dependencies"]
    (i,) = [i for i, dep in enumerate(deps) if dep.startswith("ray[serve]==")]
    deps[i] = "ray[serve]==9.9.9"


def raise_python_floor(project: dict[str, Any], rs: dict[str, Any]) -> None:
    project["project"]["requires-python"] = ">=3.99"


def run_bare_ray_image(project: dict[str, Any], rs: dict[str, Any]) -> None:
    worker = rs["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    worker["image"] = "rayproject/ray:" + worker["image"].split(":")[1]


def set_dep(project: dict[str, Any], name: str, new: str, extra: str | None = None) -> None:
    deps = project["project"]["dependencies"] if extra is None else project["project"]["optional-dependencies"][extra]
    (i,) = [i for i, dep in enumerate(deps) if re.match(rf"{re.escape(name)}[\[=]", dep)]
    deps[i] = new


@pytest.mark.parametrize("change, expected", [
    (bump_ray_pin, ["Dockerfile base image has Ray", "RayService rayVersion"]),
    (raise_python_floor, ["Dockerfile Python"]),
    (run_bare_ray_image, ["RayService image rayproject/ray:"]),
    (lambda project, rs: set_dep(project, "torch", "torch==9.9.9"), ["torch 9.9.9 has no line in PYPI_TORCH_BUILDS"]),
    (lambda project, rs: set_dep(project, "triton", "triton==3.9.0"), ["pyproject pins triton 3.9.0"]),
    (lambda project, rs: set_dep(project, "flash-attn-4", "flash-attn-4[cu12]==4.0.0b36", "gpu"),
     ["the gpu extra's CUDA extras are cu['12', '13']"]),
])
def test_image_drift_is_caught(change, expected):
    project, rs = pyproject(), rayservice()
    change(project, rs)
    drift = image_drift(dockerfile(), project, rs)
    assert len(drift) == len(expected) and all(line.startswith(p) for line, p in zip(drift, expected)), drift


def test_a_cuda_12_base_image_is_caught():
    text = dockerfile().replace("-py311-cu130", "-py311-cu128")
    drift = cuda_drift(base_image(text), pyproject())
    assert drift == ["Dockerfile base image has CUDA cu128, PyPI's torch 2.13.0 is built for CUDA 13.0"]


def test_installed_torch_and_triton_are_the_pinned_ones():
    """This machine tests the Triton that GPU machines run; on a CUDA build of torch, also the CUDA version."""
    import torch

    project = pyproject()
    assert importlib.metadata.version("triton") == pin(project, "triton"), "reinstall: pip install -e '.[test]'"
    assert torch.__version__.split("+")[0] == pin(project, "torch")
    if torch.version.cuda is not None:
        assert torch.version.cuda == PYPI_TORCH_BUILDS[pin(project, "torch")][0]


def test_dockerfile_installs_the_gpu_extra_and_imports_it():
    """Wheels only (no `--no-build-isolation` compile); the build's last step imports flash-attn 4 and its CuTe
    DSL native libraries, and checks torch's CUDA against the base image."""
    text, project = dockerfile(), pyproject()
    assert pin(project, "flash-attn-4", "gpu")
    assert re.search(r"^RUN pip install --no-cache-dir \"\.\[gpu\]\"", text, flags=re.MULTILINE), \
        "install the project as pip install '.[gpu]' (torch comes with it, as pinned)"
    check = text[text.index('python -c "'):]
    major = PYPI_TORCH_BUILDS[pin(project, "torch")][0].split(".")[0]
    assert "flash_attn.cute" in check and "cutlass" in check and f"torch.version.cuda.startswith('{major}.')" in check


def test_dockerfile_copies_what_the_wheel_needs_and_dockerignore_keeps_it():
    project = pyproject()
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {src for line in re.findall(r"^COPY\s+(?:--\S+\s+)*(.+)$", dockerfile(), flags=re.MULTILINE)
              for src in line.split()[:-1]}
    assert packages | {"pyproject.toml", project["project"]["readme"]} <= copied
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert not copied & ignored, f".dockerignore drops files the Dockerfile copies: {copied & ignored}"


def test_image_grpc_message_limit_agrees_with_serve_config():
    from deployments.config import AppArgs
    from deployments.launcher import GRPC_MESSAGE_SIZE_ENV, grpc_message_limit

    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    expected = grpc_message_limit(AppArgs.model_validate(config["applications"][0]["args"]).limits.max_request_bytes)
    found = re.search(rf"^ENV {GRPC_MESSAGE_SIZE_ENV}=(\d+)$", dockerfile(), re.MULTILINE)
    assert found and int(found.group(1)) == expected, f"the Dockerfile must set ENV {GRPC_MESSAGE_SIZE_ENV}={expected}"
