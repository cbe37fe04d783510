"""The handler registry finds handlers by entry-point name, lazily, with clear errors."""

from __future__ import annotations

import subprocess
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
    # A fresh interpreter: this process may already have imported handlers.
    probe = (
        "import sys; from discovery_handlers.registry import known_handler_names; "
        "names = known_handler_names(); "
        "print('debugEcho' in names, 'discovery_handlers.debug_echo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "False"]
