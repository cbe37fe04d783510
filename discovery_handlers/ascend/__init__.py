"""``ascend``: Huawei Ascend NPUs as schedulable local devices, the way Huawei's plugin shows them,
so pods written for it run unchanged (docs/handlers/ascend.md). ``handler`` is the contract
adapter; ``details``, ``chips``, ``npu_smi``, ``devices``, ``faults`` and ``fault_table`` are
pure logic; ``dcmi`` wraps Huawei's DCMI library, ``dcmi_lanes`` bounds its calls, ``sources``
runs one discovery pass. Importing this package does not load the DCMI library.
"""

from discovery_handlers.ascend.handler import AscendHandler

handler = AscendHandler()

__all__ = ["AscendHandler", "handler"]
