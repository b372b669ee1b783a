"""The container recipe and its versions, offline (no Docker here): the Dockerfile starts from the official Ray GPU
image of the Ray version pyproject.toml pins, with a Python that requires-python allows, installs torch as pinned
and the project with its `gpu` extra; the RayService runs an image tagged from those same versions.
"""

from __future__ import annotations

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
RAY_IMAGE = re.compile(r"^rayproject/ray:(?P<ray>\d+\.\d+\.\d+)-py(?P<py>3)(?P<minor>\d+)-(?P<cuda>cu\d+)$")


def dockerfile() -> str:
    return (ROOT / "Dockerfile").read_text()


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def rayservice() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "k8s" / "rayservice.yaml").read_text())


def pin(project: dict[str, Any], name: str) -> str:
    """The exact version pyproject.toml pins `name` to (`name==X` or `name[extras]==X`)."""
    (version,) = [m[1] for dep in project["project"]["dependencies"]
                  if (m := re.fullmatch(rf"{re.escape(name)}(?:\[[^\]]*\])?==([^;\s]+)", dep.strip()))]
    return version


def base_image(text: str) -> re.Match:
    froms = re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE)
    assert len(froms) == 1, f"expected one FROM (a single stage), got {froms}"
    match = RAY_IMAGE.match(froms[0])
    assert match, f"base image {froms[0]} is not an official rayproject/ray:<ray>-py3<minor>-cu<cuda> GPU image"
    return match


def image_tag(project: dict[str, Any], base: re.Match) -> str:
    """The tag the radixserve image is pushed with: project version, then the base image's versions."""
    return f"{project['project']['version']}-ray{base['ray']}-py{base['py']}{base['minor']}-{base['cuda']}"


def image_drift(text: str, project: dict[str, Any], rs: dict[str, Any]) -> list[str]:
    """Where the Dockerfile or the RayService disagree with pyproject.toml's pins, one line each."""
    base, ray = base_image(text), pin(project, "ray")
    drift = [] if base["ray"] == ray else [f"Dockerfile base image has Ray {base['ray']}, pyproject pins {ray}"]
    python = f"3.{base['minor']}"
    if python not in SpecifierSet(project["project"]["requires-python"]):
        drift.append(f"Dockerfile Python {python} is outside requires-python {project['project']['requires-python']}")
    torch = re.findall(r'"torch==([^"]+)"', text)
    if torch != [pin(project, "torch")]:
        drift.append(f"Dockerfile installs torch {torch}, pyproject pins {pin(project, 'torch')}")
    cluster = rs["spec"]["rayClusterConfig"]
    if cluster["rayVersion"] != ray:
        drift.append(f"RayService rayVersion {cluster['rayVersion']}, pyproject pins Ray {ray}")
    templates = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for image in {c["image"] for t in templates for c in t["spec"]["containers"]}:
        repository, _, tag = image.rpartition(":")
        if repository.rsplit("/", 1)[-1] != "radixserve" or tag != image_tag(project, base):
            drift.append(f"RayService image {image} is not radixserve:{image_tag(project, base)}")
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


@pytest.mark.parametrize("change, expected", [
    (bump_ray_pin, ["Dockerfile base image has Ray", "RayService rayVersion"]),
    (raise_python_floor, ["Dockerfile Python"]),
    (run_bare_ray_image, ["RayService image rayproject/ray:"]),
])
def test_image_drift_is_caught(change, expected):
    project, rs = pyproject(), rayservice()
    change(project, rs)
    drift = image_drift(dockerfile(), project, rs)
    assert len(drift) == len(expected) and all(line.startswith(p) for line, p in zip(drift, expected)), drift


def test_dockerfile_installs_the_gpu_extra_without_build_isolation():
    text = dockerfile()
    assert "flash-attn" in " ".join(pyproject()["project"]["optional-dependencies"]["gpu"])
    assert re.search(r"pip install [^\n]*--no-build-isolation [^\n]*\"\.\[gpu\]\"", text), \
        "install the project as pip install --no-build-isolation '.[gpu]' (flash-attn builds against torch)"


def test_dockerfile_copies_what_the_wheel_needs_and_dockerignore_keeps_it():
    project = pyproject()
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = {src for line in re.findall(r"^COPY\s+(?:--\S+\s+)*(.+)$", dockerfile(), flags=re.MULTILINE)
              for src in line.split()[:-1]}
    assert packages | {"pyproject.toml", project["project"]["readme"]} <= copied
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert not copied & ignored, f".dockerignore drops files the Dockerfile copies: {copied & ignored}"
