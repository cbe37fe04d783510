"""How the controller configures kopf: peering for two replicas or standalone, retries that
ride out an outage of any length, no per-object kopf handler, and every flag's unit."""

from __future__ import annotations

import itertools

import kopf
import pytest

from controller.engine.handlers import register
from controller.main import FINALIZER, kopf_settings
from controller.settings import ControllerSettings, PeeringSettings

#: kopf heart-beats every second only for lifetimes up to this (``lifetime - 5..10`` beyond).
KOPF_ONE_SECOND_HEARTBEAT_MAX_S = 6


def test_peering_is_mandatory_with_this_replicas_priority() -> None:
    settings = ControllerSettings(namespaces=("a",),
                                  peering=PeeringSettings(priority=42, lifetime_s=7))
    config = kopf_settings(settings)
    assert config.peering.name == "edgeplug-controller"
    assert config.peering.priority == 42
    assert config.peering.lifetime == 7
    assert config.peering.mandatory
    assert not config.peering.clusterwide, "namespaced controller: KopfPeering per namespace"
    assert config.persistence.finalizer == FINALIZER
    assert not config.posting.loggers, "only explicit Events are posted"


def test_api_retries_never_run_out() -> None:
    backoffs = kopf_settings(ControllerSettings()).networking.error_backoffs
    for _ in range(2):  # kopf iterates it afresh for every request
        delays = list(itertools.islice(iter(backoffs), 1000))  # type: ignore[arg-type]
        assert len(delays) == 1000, "an outage must not end the retries"
        assert max(delays) <= 5, "a returning API server is seen within seconds"


def test_default_failover_gap_is_a_few_seconds() -> None:
    assert PeeringSettings.lifetime_s <= KOPF_ONE_SECOND_HEARTBEAT_MAX_S
    assert kopf_settings(ControllerSettings()).peering.lifetime == PeeringSettings.lifetime_s


def test_cluster_wide_and_standalone() -> None:
    assert kopf_settings(ControllerSettings()).peering.clusterwide
    assert kopf_settings(ControllerSettings(peering=PeeringSettings(name=None))).peering.standalone


def test_replicas_draw_different_priorities() -> None:
    priorities = {ControllerSettings().peering.priority for _ in range(20)}
    assert len(priorities) > 1, "equal priorities would pause every replica"


def test_no_kopf_handler_per_object_so_no_finalizer() -> None:
    registry = kopf.OperatorRegistry()
    register(registry)
    for handlers in (registry._indexing, registry._watching, registry._spawning,
                     registry._changing):
        assert not handlers.get_all_handlers()


def test_every_flag_says_its_unit_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ControllerSettings.from_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--resync-interval S", "--pending-grace S", "--restart-backoff-base S",
                 "--restart-backoff-max S", "--node-not-ready-grace S",
                 "--orphan-instance-grace S", "--peering-lifetime S"):
        assert flag in text, flag
    assert text.count("(default:") >= 9
    assert "seconds" in text
