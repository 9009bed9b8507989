"""Package discovery for kvsim (metadata lives in pyproject.toml).

NOTE: catalogue data lives at the repository root (``hardware_profiles/``,
``workloads/``) as DESIGN.md lays out, and ships inside the wheel as the packages
``kvsim.hardware_profiles`` and ``kvsim.workloads`` so that profiles and presets
resolve after a plain, non-editable ``pip install .``.
"""

from setuptools import find_packages, setup

DATA_PACKAGES = {
    "kvsim.hardware_profiles": "hardware_profiles",
    "kvsim.workloads": "workloads",
}

setup(
    packages=find_packages(include=["kvsim", "kvsim.*"]) + list(DATA_PACKAGES),
    package_dir=DATA_PACKAGES,
)
