"""How the controller configures kopf: peering for two replicas, or standalone."""

from __future__ import annotations

from controller.main import FINALIZER, kopf_settings
from controller.persistence import NoDiffBase
from controller.settings import ControllerSettings


def test_peering_is_mandatory_with_this_replicas_priority() -> None:
    settings = ControllerSettings(namespaces=("a",), priority=42, peering_lifetime_s=7)
    config = kopf_settings(settings)
    assert config.peering.name == "edgeplug-controller"
    assert config.peering.priority == 42
    assert config.peering.lifetime == 7
    assert config.peering.mandatory
    assert not config.peering.clusterwide, "namespaced controller: KopfPeering per namespace"
    assert config.persistence.finalizer == FINALIZER
    assert not config.posting.loggers, "only explicit Events are posted"
    assert isinstance(config.persistence.diffbase_storage, NoDiffBase), "no per-object essence"


def test_cluster_wide_and_standalone() -> None:
    assert kopf_settings(ControllerSettings()).peering.clusterwide
    assert kopf_settings(ControllerSettings(peering_name=None)).peering.standalone


def test_replicas_draw_different_priorities() -> None:
    priorities = {ControllerSettings().priority for _ in range(20)}
    assert len(priorities) > 1, "equal priorities would pause every replica"
