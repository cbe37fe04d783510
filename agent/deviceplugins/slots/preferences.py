"""The device-plugin backends' answers to ``GetPreferredAllocation``, as pure functions.

The kubelet offers ``available`` ids, some it ``must_include``, and asks for ``size`` of them;
these order them so a pod keeps what it held and, for a Configuration's virtual ids, spreads
over distinct Instances first. No I/O: the backends pass in what they hold.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from agent.deviceplugins.slots.rules import SlotRef


def instance_preference(available: Sequence[str], must_include: Sequence[str], size: int,
                        held: Collection[str]) -> list[str]:
    """An Instance's slot ids: the required ones, then the ones this node holds, then the rest."""
    ordered = [*must_include]
    ordered += [s for s in available if s in held and s not in ordered]
    ordered += [s for s in available if s not in ordered]
    return ordered[: max(size, len(must_include))]


def configuration_preference(available: Sequence[str], must_include: Sequence[str], size: int,
                             held: Mapping[str, SlotRef]) -> list[str]:
    """A Configuration's virtual ids: the required ones, then ids that hold a slot (on Instances
    not yet used by the required ones first), then ids still unmapped."""
    ordered = [*must_include]
    seen = {held[v].instance for v in ordered if v in held}
    held_here = [v for v in available if v in held and v not in ordered]
    held_here.sort(key=lambda v: held[v].instance in seen)
    ordered += held_here
    ordered += [v for v in available if v not in ordered]
    return ordered[: max(size, len(must_include))]
