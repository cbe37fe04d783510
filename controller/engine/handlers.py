"""The kopf face of the controller: how kopf logs in, and nothing per object.

``register`` adds the login handler only: no per-object handler, index, timer or finalizer. Why:
docs/architecture.md, "Design choices" and "The controller's modules".
"""

from __future__ import annotations

from typing import Any

import kopf


def register(registry: kopf.OperatorRegistry) -> None:
    """Registers the controller's kopf handlers (login only) in ``registry``."""

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> Any:
        return kopf.login_via_client(**kwargs)
