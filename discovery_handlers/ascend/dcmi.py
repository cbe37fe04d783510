"""A thin ctypes wrapper over Huawei's DCMI library (``libdcmi.so``), with its real C signatures
(``_SIGNATURES``), the one place that touches that C ABI. Asked for a card list and a card's
chips, it hands back ``Chip`` records with the raw health (level and error codes; ``faults``
judges them) and turns DCMI's return codes (0 success, ``DCMI_ERR_CODE_*`` -8001 and below)
into ``DcmiError``. Every call blocks and may never return: ``dcmi_lanes`` runs them.
"""

from __future__ import annotations

import ctypes
import ipaddress
import threading
from dataclasses import dataclass
from typing import Any

from discovery_handlers.ascend import vnpu_dcmi
from discovery_handlers.ascend.chips import Chip
from discovery_handlers.contract import HEALTHY, Health

LIBRARY_NAME = "libdcmi.so"
MAX_CARD_NUM = 64  # MAX_CARD_NUM in dcmi_interface_api.h
MAX_CHIP_NAME_LEN = 32
MAX_ERROR_CODES = 128  # error codes read per chip
DCMI_OK = 0
ERROR_NAMES = {
    -8001: "DCMI_ERR_CODE_INVALID_PARAMETER", -8002: "DCMI_ERR_CODE_OPER_NOT_PERMITTED",
    -8003: "DCMI_ERR_CODE_MEM_OPERATE_FAIL", -8004: "DCMI_ERR_CODE_SECURE_FUN_FAIL",
    -8005: "DCMI_ERR_CODE_INNER_ERR", -8006: "DCMI_ERR_CODE_TIME_OUT",
    -8007: "DCMI_ERR_CODE_INVALID_DEVICE_ID", -8008: "DCMI_ERR_CODE_DEVICE_NOT_EXIST",
    -8009: "DCMI_ERR_CODE_IOCTL_FAIL", -8010: "DCMI_ERR_CODE_SEND_MSG_FAIL",
    -8011: "DCMI_ERR_CODE_RECV_MSG_FAIL", -8012: "DCMI_ERR_CODE_NOT_REDAY",
    -8013: "DCMI_ERR_CODE_NOT_SUPPORT_IN_CONTAINER", -8255: "DCMI_ERR_CODE_NOT_SUPPORT",
}

_c_int_p = ctypes.POINTER(ctypes.c_int)
_c_uint_p = ctypes.POINTER(ctypes.c_uint)


class DcmiChipInfo(ctypes.Structure):
    _fields_ = [
        ("chip_type", ctypes.c_ubyte * MAX_CHIP_NAME_LEN),
        ("chip_name", ctypes.c_ubyte * MAX_CHIP_NAME_LEN),
        ("chip_ver", ctypes.c_ubyte * MAX_CHIP_NAME_LEN),
        ("aicore_cnt", ctypes.c_uint),
    ]


class DcmiHbmInfo(ctypes.Structure):
    _fields_ = [
        ("memory_size", ctypes.c_ulonglong),  # MB
        ("freq", ctypes.c_uint),
        ("memory_usage", ctypes.c_ulonglong),
        ("temp", ctypes.c_int),
        ("bandwith_util_rate", ctypes.c_uint),
    ]


class DcmiMemoryInfo(ctypes.Structure):
    _fields_ = [
        ("memory_size", ctypes.c_ulonglong),  # MB
        ("memory_available", ctypes.c_ulonglong),
        ("freq", ctypes.c_uint),
        ("hugepagesize", ctypes.c_ulong),
        ("hugepages_total", ctypes.c_ulong),
        ("hugepages_free", ctypes.c_ulong),
        ("utiliza", ctypes.c_uint),
        ("reserve", ctypes.c_ubyte * 60),
    ]


class DcmiPcieInfoAll(ctypes.Structure):
    _fields_ = [
        ("venderid", ctypes.c_uint), ("subvenderid", ctypes.c_uint),
        ("deviceid", ctypes.c_uint), ("subdeviceid", ctypes.c_uint),
        ("domain", ctypes.c_int), ("bdf_busid", ctypes.c_uint),
        ("bdf_deviceid", ctypes.c_uint), ("bdf_funcid", ctypes.c_uint),
        ("reserve", ctypes.c_ubyte * 32),
    ]


class DcmiIpAddr(ctypes.Structure):
    _fields_ = [
        ("u_addr", ctypes.c_ubyte * 16),  # union { ip6[16]; ip4[4]; }
        ("ip_type", ctypes.c_int),  # enum dcmi_ip_addr_type
    ]


DCMI_IPADDR_TYPE_V4 = 0
DCMI_IPADDR_TYPE_V6 = 1
DCMI_ROCE_PORT = 1  # enum dcmi_port_type

# The functions used, as dcmi_interface_api.h declares them:
#     int dcmi_init(void);
#     int dcmi_get_card_list(int *card_num, int *card_list, int list_len);
#     int dcmi_get_device_num_in_card(int card_id, int *device_num);
#     int dcmi_get_device_logic_id(int *device_logic_id, int card_id, int device_id);
#     int dcmi_get_device_phyid_from_logicid(unsigned int logicid, unsigned int *phyid);
#     int dcmi_get_device_chip_info(int card_id, int device_id, struct dcmi_chip_info *chip_info);
#     int dcmi_get_device_health(int card_id, int device_id, unsigned int *health);
#     int dcmi_get_device_errorcode_v2(int card_id, int device_id, int *error_count,
#                                      unsigned int *error_code_list, unsigned int list_len);
#     int dcmi_get_device_hbm_info(int card_id, int device_id, struct dcmi_hbm_info *hbm_info);
#     int dcmi_get_device_memory_info_v3(int card_id, int device_id,
#                                        struct dcmi_get_memory_info_stru *memory_info);
#     int dcmi_get_device_pcie_info_v2(int card_id, int device_id, struct dcmi_pcie_info_all *);
#     int dcmi_get_device_ip(int card_id, int device_id, enum dcmi_port_type input_type,
#                            int port_id, struct dcmi_ip_addr *ip, struct dcmi_ip_addr *mask);
#     int dcmi_get_device_network_health(int card_id, int device_id,
#                                        enum dcmi_rdfx_detect_result *result);
# and the vNPU calls of ``vnpu_dcmi``. The IP and network calls are asked only of 910-family
# chips (docs/handlers/ascend.md, "Network (RoCE link) health of 910 chips").
_SIGNATURES: dict[str, list[Any]] = {
    "dcmi_init": [],
    "dcmi_get_card_list": [_c_int_p, _c_int_p, ctypes.c_int],
    "dcmi_get_device_num_in_card": [ctypes.c_int, _c_int_p],
    "dcmi_get_device_logic_id": [_c_int_p, ctypes.c_int, ctypes.c_int],
    "dcmi_get_device_phyid_from_logicid": [ctypes.c_uint, _c_uint_p],
    "dcmi_get_device_chip_info": [ctypes.c_int, ctypes.c_int, ctypes.POINTER(DcmiChipInfo)],
    "dcmi_get_device_health": [ctypes.c_int, ctypes.c_int, _c_uint_p],
    "dcmi_get_device_errorcode_v2": [ctypes.c_int, ctypes.c_int, _c_int_p, _c_uint_p,
                                     ctypes.c_uint],
    "dcmi_get_device_hbm_info": [ctypes.c_int, ctypes.c_int, ctypes.POINTER(DcmiHbmInfo)],
    "dcmi_get_device_memory_info_v3": [ctypes.c_int, ctypes.c_int,
                                       ctypes.POINTER(DcmiMemoryInfo)],
    "dcmi_get_device_pcie_info_v2": [ctypes.c_int, ctypes.c_int,
                                     ctypes.POINTER(DcmiPcieInfoAll)],
    "dcmi_get_device_ip": [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                           ctypes.POINTER(DcmiIpAddr), ctypes.POINTER(DcmiIpAddr)],
    # enum dcmi_rdfx_detect_result *: an enum is an int-sized unsigned value here
    "dcmi_get_device_network_health": [ctypes.c_int, ctypes.c_int, _c_uint_p],
    "dcmi_get_device_info": vnpu_dcmi.SIGNATURE,
    "dcmi_create_vdevice": vnpu_dcmi.CREATE_SIGNATURE,
    "dcmi_set_destroy_vdevice": vnpu_dcmi.DESTROY_SIGNATURE,
}
#: Without these the library is of no use; the others are read when exported.
_REQUIRED = ("dcmi_init", "dcmi_get_card_list", "dcmi_get_device_num_in_card",
             "dcmi_get_device_logic_id", "dcmi_get_device_phyid_from_logicid",
             "dcmi_get_device_health")


class DcmiError(RuntimeError):
    """The library cannot be loaded or initialised, or cannot list the cards."""


def error_text(function: str, code: int) -> str:
    return f"{function} returned {code} ({ERROR_NAMES.get(code, 'unknown DCMI error')})"


@dataclass(frozen=True)
class DcmiScan:
    chips: tuple[Chip, ...]
    problems: tuple[str, ...]


class Dcmi:
    """One loaded, initialised DCMI library."""

    def __init__(self, path: str | None) -> None:
        target = path or LIBRARY_NAME
        try:
            self._lib = ctypes.CDLL(target)
        except OSError as exc:
            raise DcmiError(f"cannot load {target}: {exc}") from exc
        self._functions: dict[str, Any] = {}
        for name, argtypes in _SIGNATURES.items():
            try:
                function = getattr(self._lib, name)
            except AttributeError:
                if name in _REQUIRED:
                    raise DcmiError(f"{target} does not export {name}") from None
                continue
            function.argtypes = argtypes
            function.restype = ctypes.c_int
            self._functions[name] = function
        code = self._call("dcmi_init")
        if code != DCMI_OK:
            raise DcmiError(error_text("dcmi_init", code))

    def _call(self, name: str, *args: Any) -> int:
        ident = threading.get_ident()
        _in_flight[ident] = name  # read by a caller that gave up waiting (``calling``)
        try:
            return int(self._functions[name](*args))
        finally:
            _in_flight.pop(ident, None)

    def call(self, name: str, *args: Any) -> int:
        """``name(*args)``'s return code; ``DcmiError`` when the library does not export it."""
        if not self.has(name):
            raise DcmiError(f"the DCMI library does not export {name}")
        return self._call(name, *args)

    def has(self, name: str) -> bool:
        return name in self._functions

    def card_list(self) -> tuple[int, ...]:
        """The cards DCMI lists; raises ``DcmiError`` when it cannot tell."""
        count = ctypes.c_int(0)
        cards = (ctypes.c_int * MAX_CARD_NUM)()
        code = self._call("dcmi_get_card_list", ctypes.byref(count), cards, MAX_CARD_NUM)
        if code != DCMI_OK:
            raise DcmiError(error_text("dcmi_get_card_list", code))
        if not 0 <= count.value <= MAX_CARD_NUM:
            raise DcmiError(f"dcmi_get_card_list reported {count.value} cards")
        return tuple(cards[:count.value])

    def read_card(self, card: int) -> DcmiScan:
        """Every chip of ``card`` with model, memory and the raw health (health level, error
        codes); a chip that cannot be read is skipped and named in the problems."""
        chips: list[Chip] = []
        problems: list[str] = []
        num = ctypes.c_int(0)
        code = self._call("dcmi_get_device_num_in_card", card, ctypes.byref(num))
        if code != DCMI_OK or not 0 <= num.value <= MAX_CARD_NUM:
            problems.append(f"card {card}: " + (error_text("dcmi_get_device_num_in_card",
                            code) if code else f"{num.value} chips reported"))
            return DcmiScan(chips=(), problems=tuple(problems))
        for dev in range(num.value):
            chip = self._chip(card, dev, problems)
            if chip is not None:
                chips.append(chip)
        return DcmiScan(chips=tuple(chips), problems=tuple(problems))

    def _chip(self, card: int, dev: int, problems: list[str]) -> Chip | None:
        where = f"card {card} chip {dev}"
        logic = ctypes.c_int(-1)
        code = self._call("dcmi_get_device_logic_id", ctypes.byref(logic), card, dev)
        if code != DCMI_OK:
            problems.append(f"{where}: {error_text('dcmi_get_device_logic_id', code)}")
            return None
        phy = ctypes.c_uint(0)
        code = self._call("dcmi_get_device_phyid_from_logicid", logic.value, ctypes.byref(phy))
        if code != DCMI_OK:
            problems.append(f"{where}: {error_text('dcmi_get_device_phyid_from_logicid', code)}")
            return None
        own: list[str] = []
        info = self._chip_info(card, dev, own)
        health, level, codes = self._health(card, dev, own)
        name = _text(info.chip_name) if info else ""
        roce = name.startswith("910")
        return Chip(
            phy_id=phy.value, card_id=card, device_index=dev, logic_id=logic.value,
            chip_type=_text(info.chip_type) if info else "",
            chip_name=name,
            chip_version=_text(info.chip_ver) if info else "",
            aicore_count=info.aicore_cnt if info else None,
            memory_mb=self._memory(card, dev, own),
            bus_id=self._bus_id(card, dev),
            roce_ip=self._roce_ip(card, dev) if roce else "",
            network_result=self._network_result(card, dev) if roce else None,
            health=health, health_level=level, error_codes=codes,
            vnpus=self._vnpus(card, dev, own),
            problems=tuple(f"{where}: {p}" for p in own),
        )

    def _chip_info(self, card: int, dev: int, problems: list[str]) -> DcmiChipInfo | None:
        if not self.has("dcmi_get_device_chip_info"):
            problems.append("dcmi_get_device_chip_info not exported")
            return None
        info = DcmiChipInfo()
        code = self._call("dcmi_get_device_chip_info", card, dev, ctypes.byref(info))
        if code != DCMI_OK:
            problems.append(error_text("dcmi_get_device_chip_info", code))
            return None
        return info

    def _memory(self, card: int, dev: int, problems: list[str]) -> int | None:
        if self.has("dcmi_get_device_hbm_info"):
            hbm = DcmiHbmInfo()
            if (self._call("dcmi_get_device_hbm_info", card, dev, ctypes.byref(hbm)) == DCMI_OK
                    and hbm.memory_size):
                return int(hbm.memory_size)
        if self.has("dcmi_get_device_memory_info_v3"):
            mem = DcmiMemoryInfo()
            code = self._call("dcmi_get_device_memory_info_v3", card, dev, ctypes.byref(mem))
            if code == DCMI_OK and mem.memory_size:
                return int(mem.memory_size)
            problems.append("memory size unreadable (" +
                            (error_text("dcmi_get_device_memory_info_v3", code) if code
                             else "reported 0 MB") + ")")
        return None

    def _bus_id(self, card: int, dev: int) -> str:
        if not self.has("dcmi_get_device_pcie_info_v2"):
            return ""
        pcie = DcmiPcieInfoAll()
        if self._call("dcmi_get_device_pcie_info_v2", card, dev, ctypes.byref(pcie)) != DCMI_OK:
            return ""
        return (f"{pcie.domain & 0xFFFF:04X}:{pcie.bdf_busid & 0xFF:02X}:"
                f"{pcie.bdf_deviceid & 0x1F:02X}.{pcie.bdf_funcid & 0x7}")

    def _roce_ip(self, card: int, dev: int) -> str:
        """The chip's RoCE address, "" when DCMI gives none (no RoCE port, not exported)."""
        if not self.has("dcmi_get_device_ip"):
            return ""
        for kind, size in ((DCMI_IPADDR_TYPE_V4, 4), (DCMI_IPADDR_TYPE_V6, 16)):
            ip, mask = DcmiIpAddr(ip_type=kind), DcmiIpAddr(ip_type=kind)
            if self._call("dcmi_get_device_ip", card, dev, DCMI_ROCE_PORT, 0,
                          ctypes.byref(ip), ctypes.byref(mask)) != DCMI_OK:
                continue
            address = ipaddress.ip_address(bytes(ip.u_addr[:size]))
            if not (address.is_unspecified or address.is_link_local):
                return str(address)
        return ""

    def _vnpus(self, card: int, dev: int, problems: list[str]) -> Any:
        """The chip's vNPUs (``vnpu_dcmi``); None when DCMI cannot tell."""
        if not self.has("dcmi_get_device_info"):
            return None
        found, problem = vnpu_dcmi.read_vnpus(self._call, card, dev)
        if problem:
            problems.append(f"vNPUs unreadable: {problem}")
        return found

    def _network_result(self, card: int, dev: int) -> int | None:
        """The RoCE link check's result (``enum dcmi_rdfx_detect_result``); None when DCMI
        does not say (not exported, not supported by the board, or an error)."""
        if not self.has("dcmi_get_device_network_health"):
            return None
        result = ctypes.c_uint(0)
        code = self._call("dcmi_get_device_network_health", card, dev, ctypes.byref(result))
        return int(result.value) if code == DCMI_OK else None

    def _health(self, card: int, dev: int, problems: list[str]
                ) -> tuple[Health, int | None, tuple[int, ...] | None]:
        """(health, DCMI health level, error codes): unhealthy here only when DCMI cannot say;
        the error codes are judged by the caller against the fault table."""
        health = ctypes.c_uint(0)
        code = self._call("dcmi_get_device_health", card, dev, ctypes.byref(health))
        if code != DCMI_OK:
            text = error_text("dcmi_get_device_health", code)
            problems.append(text)
            return Health.unhealthy(f"health unreadable: {text}"), None, None
        if not self.has("dcmi_get_device_errorcode_v2"):
            return HEALTHY, health.value, None
        count = ctypes.c_int(0)
        codes = (ctypes.c_uint * MAX_ERROR_CODES)()
        code = self._call("dcmi_get_device_errorcode_v2", card, dev, ctypes.byref(count),
                          codes, MAX_ERROR_CODES)
        if code != DCMI_OK:
            text = error_text("dcmi_get_device_errorcode_v2", code)
            problems.append(text)
            return Health.unhealthy(f"error codes unreadable: {text}"), health.value, None
        return HEALTHY, health.value, tuple(codes[:max(0, min(count.value, MAX_ERROR_CODES))])


def _text(raw: Any) -> str:
    """A ``unsigned char[32]`` field: up to the first NUL, printable ASCII only (a library that
    fills the field with garbage gives a shorter name, never a control character)."""
    data = bytes(raw).split(b"\0", 1)[0]
    return "".join(chr(b) for b in data if 0x20 < b < 0x7F)


#: The DCMI function each thread is inside now, by thread id.
_in_flight: dict[int, str] = {}


def calling(thread_id: int) -> str:
    """The DCMI function thread ``thread_id`` is inside now ("" when none)."""
    return _in_flight.get(thread_id, "")


_loaded: dict[str | None, Dcmi] = {}
_load_locks: dict[str | None, threading.Lock] = {}
_locks_lock = threading.Lock()


def load(path: str | None) -> Dcmi:
    """The library at ``path`` (None: ``libdcmi.so`` on the loader's search path), loaded and
    initialised once per process (``dcmi_init`` is meant to be called once). One lock per
    path: a ``dcmi_init`` that hangs holds back only its own library."""
    with _locks_lock:
        lock = _load_locks.setdefault(path, threading.Lock())
    with lock:
        lib = _loaded.get(path)
        if lib is None:
            lib = _loaded[path] = Dcmi(path)
        return lib
