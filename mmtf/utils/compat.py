"""Every private attribute of Lightning, Hydra, OmegaConf and torch that mmtf touches.

A library's private names can change in any release. Each one mmtf cannot do without is read
or written here, in one small function whose docstring says why no public API serves and which
versions were checked; ``tests/unit/utils/test_private_api.py`` fails when one is used anywhere
else in the package, or when an attribute named here disappears from the installed libraries.
"""

from __future__ import annotations
