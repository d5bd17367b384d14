"""deploy/kubernetes: the hands on Enterprise Gateway in a cluster (docs/scale.md, "Hands on Kubernetes").
No cluster here: the files are checked as far as can be without one. They parse; the kernelspec names
Enterprise Gateway's Kubernetes process proxy, which exists (imported in EG's own environment); the chart's
values start only that kernelspec; the kernel image installs the packages the hands' kernel has here,
with pyproject.toml's bounds."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "kubernetes"
KERNELSPEC = DEPLOY / "kernelspecs" / "python_workbench" / "kernel.json"
# what the hands' kernel imports of the workbench's environment: the kernel itself, widgets, and what the agent
# loads data and plots with (pyproject.toml: "the hands run on this environment")
KERNEL_PACKAGES = {"ipykernel", "ipywidgets", "pandas", "matplotlib", "pyarrow"}
INSTRUCTIONS = {"FROM", "ARG", "RUN", "COPY", "USER", "WORKDIR", "ENV", "LABEL"}


def dockerfile(path: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) of each instruction, continuation lines joined; AssertionError on a bad line."""
    out, pending = [], ""
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip("\\").strip() + " "
        if line.endswith("\\"):
            continue
        word, _, rest = pending.strip().partition(" ")
        assert word in INSTRUCTIONS, f"{path.name}:{n}: {word!r} is not a Dockerfile instruction here"
        out.append((word, rest))
        pending = ""
    assert not pending, f"{path.name} ends inside a continued line"
    return out


def requirement_specs(specs: list[str]) -> dict[str, str]:
    """{name: the spec as written} of requirement strings like "pandas>=2.0" (markers dropped)."""
    found = {}
    for spec in specs:
        m = re.match(r"([A-Za-z0-9_.-]+)\s*(.*)", spec.split(";")[0].strip())
        assert m, spec
        found[m.group(1).lower().replace("_", "-")] = m.group(0).replace(" ", "")
    return found


def test_the_kernelspec_names_a_kubernetes_process_proxy_and_the_image():
    spec = json.loads(KERNELSPEC.read_text())
    proxy = spec["metadata"]["process_proxy"]
    assert proxy["class_name"] == "enterprise_gateway.services.processproxies.k8s.KubernetesProcessProxy"
    assert proxy["config"]["image_name"] == "workbench-kernel:0.1.0"
    assert spec["language"] == "python" and "{kernel_id}" in spec["argv"] and "{response_address}" in spec["argv"]
    assert spec["argv"][1] == f"/usr/local/share/jupyter/kernels/{KERNELSPEC.parent.name}/scripts/launch_kubernetes.py"
    assert spec["env"] == {}  # no secret, nor anything else, rides in the kernelspec


def test_the_process_proxy_class_exists_in_enterprise_gateway():
    """Imported in EG's own environment (its module reads the cluster's config at import: stubbed, as no cluster
    is here), and it is one of EG's remote process proxies."""
    from egsupport import Unavailable, environment, skip_or_fail

    try:
        bin_dir = environment()
    except Unavailable as e:
        skip_or_fail(pytest, str(e))
    name = json.loads(KERNELSPEC.read_text())["metadata"]["process_proxy"]["class_name"]
    module, _, cls = name.rpartition(".")
    code = ("import importlib, kubernetes.config as c\nc.load_incluster_config = lambda *a, **k: None\n"
            "from enterprise_gateway.services.processproxies.processproxy import RemoteProcessProxy\n"
            f"k = getattr(importlib.import_module({module!r}), {cls!r})\nprint(issubclass(k, RemoteProcessProxy))")
    done = subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]


def test_the_charts_values_start_only_the_workbench_kernelspec():
    values = yaml.safe_load((DEPLOY / "values.yaml").read_text())
    kernel = values["kernel"]
    assert kernel["allowedKernels"] == [KERNELSPEC.parent.name] == [kernel["defaultKernelName"]]
    assert kernel["cullIdleTimeout"] > 1800  # longer than the hands' idle_timeout: a live host's kernel is never culled
    assert values["kernelspecs"]["image"] == "workbench-kernelspecs:0.1.0"
    assert "authToken" not in values  # given at install time, from a secret
    assert values["image"].endswith(":3.3.0") and values["service"]["type"] == "ClusterIP"


def test_the_kernel_image_has_the_packages_of_the_hands_kernel_with_pyprojects_bounds():
    steps = dockerfile(DEPLOY / "kernel.Dockerfile")
    assert steps[0] == ("ARG", "EG_VERSION=3.3.0") and steps[1] == ("FROM", "elyra/kernel-py:${EG_VERSION}")
    installs = [shlex.split(rest) for word, rest in steps if word == "RUN" and "pip install" in rest]
    assert len(installs) == 1
    image = requirement_specs([a for a in installs[0][2:] if not a.startswith("-")])
    declared = requirement_specs(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])
    assert set(image) == KERNEL_PACKAGES, set(image) ^ KERNEL_PACKAGES
    assert {n: declared[n] for n in KERNEL_PACKAGES} == image
    assert steps[-2] == ("USER", "jovyan")  # the kernel never runs as root


def test_the_kernelspecs_image_carries_the_kernelspec_and_egs_launch_scripts():
    steps = dockerfile(DEPLOY / "kernelspecs.Dockerfile")
    copies = [rest for word, rest in steps if word == "COPY"]
    assert f"{KERNELSPEC.relative_to(REPO)} /kernels/python_workbench/kernel.json" in copies
    assert any(c.startswith("--from=eg /usr/local/share/jupyter/kernels/python_kubernetes/scripts ") for c in copies)


def test_the_dockerfile_reader_refuses_what_is_not_a_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM x\nRUN a \\\n  b\nexec rm -rf /\n")
    with pytest.raises(AssertionError, match="not a Dockerfile instruction"):
        dockerfile(bad)
    bad.write_text("FROM x\nRUN a \\\n")
    with pytest.raises(AssertionError, match="ends inside"):
        dockerfile(bad)
