"""The label that makes the API server send an Instance to a node's agent
(``agent.kube.node_instances``): its key is a valid label key for every valid node name, one
per node, and the rule for when it belongs on an Instance."""

from __future__ import annotations

import re

import pytest

from agent.kube.node_instances import MAX_NODE_IN_LABEL, holds_usage, serves_label, wants_label

#: A label key: an optional DNS-subdomain prefix of at most 253 characters, and a name.
SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _valid_key(key: str) -> bool:
    prefix, _, name = key.partition("/")
    return (len(prefix) <= 253 and all(len(p) <= 63 for p in prefix.split("."))
            and bool(SUBDOMAIN.match(prefix)) and 0 < len(name) <= 63)


def test_the_key_names_the_node_and_is_a_valid_label_key() -> None:
    assert serves_label("node-a") == "node-a.nodes.edgeplug.io/serves"
    assert serves_label("rack-3.site-7") == "rack-3.site-7.nodes.edgeplug.io/serves"
    longest = ".".join(["a" * 63] * 3) + "." + "b" * (MAX_NODE_IN_LABEL - 3 * 64)
    assert len(longest) == MAX_NODE_IN_LABEL
    for node in ("node-a", "rack-3.site-7", longest):
        assert _valid_key(serves_label(node)), node
        assert serves_label(node).startswith(node + ".")


def test_a_node_name_too_long_for_the_prefix_gets_the_digest_form() -> None:
    too_long = ".".join(["a" * 63] * 3) + "." + "c" * (MAX_NODE_IN_LABEL - 3 * 64 + 1)
    other = too_long[:-1] + "d"
    key = serves_label(too_long)
    assert _valid_key(key)
    assert key.endswith(".digest.nodes.edgeplug.io/serves")
    assert key != serves_label(other)
    with pytest.raises(ValueError, match="node name"):
        serves_label("")


def test_the_label_belongs_where_the_node_is_listed_or_still_holds_a_slot() -> None:
    def instance(nodes: list[str], usage: dict[str, str]) -> dict[str, object]:
        return {"spec": {"nodes": nodes, "deviceUsage": usage}}

    assert wants_label(instance(["a"], {"s-0": ""}), "a")
    assert wants_label(instance(["b"], {"s-0": "a"}), "a")
    assert wants_label(instance([], {"s-0": "C:3:a"}), "a")
    assert not wants_label(instance(["b"], {"s-0": "b", "s-1": "C:3:ab"}), "a")
    assert holds_usage(instance(["b"], {"s-0": "C:0:a"}), "a")
    assert not holds_usage(instance(["a"], {"s-0": ""}), "a")
