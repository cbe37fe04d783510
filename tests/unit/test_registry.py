"""The handler registry finds handlers by entry-point name, lazily, with clear errors."""

from __future__ import annotations

import sys

import pytest

from discovery_handlers.contract import DiscoveryHandler
from discovery_handlers.registry import (
    ENTRY_POINT_GROUP,
    UnknownHandler,
    known_handler_names,
    load_handler,
)


def test_debug_echo_is_installed_under_its_name() -> None:
    assert "debugEcho" in known_handler_names()
    handler = load_handler("debugEcho")
    assert isinstance(handler, DiscoveryHandler)
    assert handler.name == "debugEcho"
    assert load_handler("debugEcho") is handler


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownHandler) as caught:
        load_handler("noSuchHandler")
    message = str(caught.value)
    assert "noSuchHandler" in message
    assert "debugEcho" in message
    assert ENTRY_POINT_GROUP in message


def test_listing_names_imports_no_handler() -> None:
    for module in [m for m in sys.modules if m.startswith("discovery_handlers.")]:
        if module not in ("discovery_handlers.registry", "discovery_handlers.contract"):
            del sys.modules[module]
    known_handler_names()
    assert "discovery_handlers.debug_echo" not in sys.modules
