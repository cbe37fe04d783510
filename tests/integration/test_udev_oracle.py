"""udev's own engine is the oracle: for every rule of the corpus (the docs' and examples' rules,
Akri's documented ones, the grammar's corners), ``edgeplug discover`` lists exactly the devices
systemd-udev's ``udevadm test`` matches, over every device of this machine's /sys (in a private
mount and network namespace: tmpfs over /run, /dev and the rules directories) and of a umockdev
bed with FTDI radios, a hub and attributes that are not ASCII. A rule udev refuses (drops the
line) must be refused by edgeplug too. Prints the corpus size and "N of N rules agree".
"""

from __future__ import annotations

import os
import shutil

import pytest
import yaml

from discovery_handlers.contract import InvalidDetails
from discovery_handlers.udev import handler
from tests.harness.udev_oracle import OracleRun, Verdict, oracle
from tests.harness.udev_oracle_corpus import DELIBERATE, DOCS, corpus, doc_rules
from tests.harness.udev_testbed import UmockdevBed

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

#: Tags written into udev's database in the namespace, where udevd would have written them
#: (devices every Linux machine has, and the namespace's own link).
TAGS = {"/devices/virtual/mem/null": ["seat"], "/devices/virtual/mem/zero": ["seat", "uaccess"],
        "/devices/virtual/net/v0": ["systemd"]}


def _require_udevadm() -> None:
    assert shutil.which("udevadm"), "udevadm missing: install Debian's udev (.ci/apt/udev.txt)"
    assert os.geteuid() == 0, "the oracle needs root for its mount and network namespaces"


def _show(verdict: Verdict) -> str:
    def side(paths: frozenset[str] | None) -> str:
        return "refused" if paths is None else f"{len(paths)} {sorted(paths)[:5]}"
    return (f"  {verdict.rule!r}\n    udev:     {side(verdict.udev)}\n"
            f"    edgeplug: {side(verdict.edgeplug)} {verdict.edgeplug_error[:200]}")


def _report(run: OracleRun, tree: str, request: pytest.FixtureRequest) -> list[Verdict]:
    """Print the verdict past pytest's capture (it belongs in every run's output)."""
    wrong = [v for v in run.verdicts if not v.agrees]
    size = len(run.verdicts)
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        print(f"\nudev oracle, {tree}: corpus of {size} rules over {run.devices} devices: "
              f"{size - len(wrong)} of {size} rules agree (edgeplug discover "
              f"{run.discover_s:.1f} s, udevadm test {run.udev_s:.1f} s)")
        for verdict in wrong:
            print(_show(verdict))
    return wrong


def test_edgeplug_lists_what_udev_matches_on_this_machine(
        request: pytest.FixtureRequest) -> None:
    _require_udevadm()
    rules = [rule for _, rule in corpus()]
    run = oracle(rules, tags=TAGS)
    assert _report(run, "this machine's /sys", request) == []
    by_rule = {v.rule: v for v in run.verdicts}
    # not vacuous: udev matched devices for many rules, and the case reads as udev's
    assert sum(1 for v in run.verdicts if v.udev) >= 30
    expected = {
        'SUBSYSTEM=="net", ATTR{carrier}!="0"': "/devices/virtual/net/lo",  # v1 is down
        'SUBSYSTEM=="net", ATTR{carrier}=="0"': "/devices/virtual/net/v0",
        'KERNEL == "random"': "/devices/virtual/mem/random",
        'KERNEL=="null", ENV{NOPE}==""': "/devices/virtual/mem/null",
    }
    for rule, devpath in expected.items():
        assert by_rule[rule].udev == frozenset({devpath}), rule
    assert by_rule['KERNEL==e"\\q"'].udev is None  # udev drops the line; edgeplug refuses
    assert by_rule['TAG!="uaccess", SUBSYSTEM=="mem"'].udev == frozenset(
        p for p in by_rule['SUBSYSTEM=="mem", DRIVER!="x"'].udev or () if not p.endswith("/zero"))


def test_edgeplug_lists_what_udev_matches_in_a_umockdev_bed(
        request: pytest.FixtureRequest) -> None:
    _require_udevadm()
    rules = [rule for _, rule in corpus()]
    with UmockdevBed() as bed:
        bed.plug("1-1", "ttyUSB0", "A50285BI")
        bed.plug("1-2", "ttyUSB1", "B1", vendor="067b", product="2303")
        bed.hub("1-3", 2, 5)
        bed.odd_attribute("1-1", "product", "café".encode())
        bed.odd_attribute("1-2", "blob", b"A\xffB")
        bed.odd_attribute("1-2", "pad", b"x \t\n")  # trailing whitespace
        bed.odd_attribute("1-2", "vtab", b"y\v")  # not whitespace to udev's stripping
        bed.bulk(3)
        bed.plug("1-4", "ttyé0", "C1")  # a kernel name that is not ASCII
        run = oracle(rules, env=bed.env())
    assert _report(run, "a umockdev bed", request) == []
    by_rule = {v.rule: v for v in run.verdicts}
    radio = "/devices/pci0000:00/0000:00:14.0/usb1/1-1/1-1:1.0/ttyUSB0/tty/ttyUSB0"
    example = 'SUBSYSTEM=="tty", ATTRS{idVendor}=="0403", ATTRS{idProduct}=="6001"'
    assert radio in (by_rule[example].udev or ())
    assert by_rule['ATTRS{product}=="caf?"'].udev == frozenset()  # '?' is one byte
    assert by_rule['ATTRS{product}=="caf??"'].udev


def test_the_corpus_holds_every_rule_the_docs_show() -> None:
    shown = doc_rules(DOCS.read_text(encoding="utf-8"))
    in_corpus = {rule for _, rule in corpus()}
    assert len(shown) >= 10
    assert [r for r in shown if r not in in_corpus and r not in DELIBERATE] == []
    sources = {source for source, _ in corpus()}
    assert {"docs", "akri", "corner"} <= sources
    assert any(s.startswith("example ") for s in sources)


@pytest.mark.parametrize("rule", sorted(DELIBERATE), ids=repr)
def test_deliberate_exceptions_are_refused_with_a_reason(rule: str) -> None:
    with pytest.raises(InvalidDetails):
        handler.parse_details(yaml.safe_dump({"udevRules": [rule]}), {})
