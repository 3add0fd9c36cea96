"""environment.yml (one serving environment for every python model) stays the union of envs/*/environment.yml, for
the default container's Python, and agrees with the build environment (requirements.txt) on shared pins."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tritonpack.containers import DEFAULT_CONTAINER, container_python
from tritonpack.envpack import ENVS_DIR

ROOT = Path(__file__).resolve().parent.parent


def conda_env(path: Path) -> tuple[str, set[str]]:
    data = yaml.safe_load(path.read_text())
    python = next(d.split("=", 1)[1] for d in data["dependencies"] if isinstance(d, str) and d.startswith("python"))
    pins = {p for d in data["dependencies"] if isinstance(d, dict) for p in d["pip"]}
    return python, pins


def test_serving_environment_is_the_union_of_the_per_model_environments_when_compared_pin_by_pin():
    python, pins = conda_env(ROOT / "environment.yml")
    per_model = [conda_env(p) for p in sorted(ENVS_DIR.glob("*/environment.yml"))]
    assert per_model, "no envs/*/environment.yml"
    assert pins == set().union(*(p for _, p in per_model))
    assert {python} | {py for py, _ in per_model} == {container_python(DEFAULT_CONTAINER)}


def test_serving_pins_equal_build_pins_when_both_files_name_a_package():
    _, pins = conda_env(ROOT / "environment.yml")
    build = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if match := re.match(r"^([A-Za-z0-9_.\-\[\]]+)==([^\s;#]+)", line):
            build[match[1].split("[")[0].lower()] = match[2]
    for pin in pins:
        name, version = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)", pin).groups()
        pinned = build.get(name.lower())
        if pinned and "python_version <" not in pin:
            assert pinned == version, f"{name}: environment.yml {version}, requirements.txt {pinned}"
