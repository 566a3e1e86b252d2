"""Packaging glue pyproject.toml cannot express: ship the repo's ``conf/`` as ``mmtf/conf``.

Developers edit ``conf/`` at the repository root; the wheel carries the same YAML files as the
package data ``mmtf/conf/**.yaml`` so an installed mmtf finds its configs without a checkout
(``mmtf.utils.config_dir``). Why: see docs/design/packaging.md.
"""

from __future__ import annotations

from setuptools import find_namespace_packages, find_packages, setup

# conf/ and each config group under it (conf/trainer, conf/model/encoder, ...) as mmtf.conf.*
CONF_PACKAGES = ["mmtf.conf", *(f"mmtf.conf.{name}" for name in find_namespace_packages(where="conf"))]

setup(
    packages=[*find_packages(include=["mmtf", "mmtf.*"]), *CONF_PACKAGES],
    package_dir={"mmtf.conf": "conf"},
    package_data={**{name: ["*.yaml"] for name in CONF_PACKAGES},
                  "mmtf.text": ["templates/*.jinja"]},   # the built-in chat templates
)
