"""``ascend``: Huawei Ascend NPUs as schedulable local devices, the way Huawei's plugin shows them.

Why this exists: pods written for Huawei's Ascend device plugin (``huawei.com/Ascend910: 2``,
``ASCEND_VISIBLE_DEVICES``) should run unchanged on edgeplug, with Akri's brokers on top. The
package is split as every handler is: ``handler`` (the contract adapter), ``details``,
``chips``, ``npu_smi``, ``devices`` and ``faults`` with its default table ``fault_table`` (pure
logic, no I/O), ``dcmi`` (the thin ctypes wrapper over Huawei's DCMI library), ``dcmi_lanes``
(every DCMI call on a thread of its card, with a timeout) and ``sources`` (one discovery pass
with its fallbacks). Importing this package does not load the DCMI library.
"""

from discovery_handlers.ascend.handler import AscendHandler

handler = AscendHandler()

__all__ = ["AscendHandler", "handler"]
