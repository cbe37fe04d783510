"""The compatibility mode's cross-node protocol: shared devices served by every listed node's
device plugins, kept apart by the agents.

Loaded only when this node first serves a shared device through device plugins (its
Configuration's allocator is ``devicePlugin``, or the agent runs without DRA): the DRA default
and local devices never import it (``agent.deviceplugins.slots.service`` loads it by name; the
import-linter contract "the default path never imports the compatibility mode" and
``tests/integration/test_compat_seam.py`` check both). ``coordinator.CrossNode`` is its one entry
point; ``demand`` follows the Pending pods pinned here, ``handoff`` gates a give-away on this
Node's ``status.allocatable``. The invariants: docs/slots.md, "Compatibility mode".
"""
