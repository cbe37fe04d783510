"""``python -m tests.bench slot_code``: the product lines of each allocation mode's slot code.

How much code each way of allocating a shared device costs.
A product line is a line of Python that is not blank, not a comment and not part of a
docstring (read with ``ast``, so a docstring's length does not count). Counted per mode:
the DRA default (the agent's slices, claims and kubelet plugin, the controller's classes and
choice), the device-plugin slot code both modes run for local devices (the default path's slot
code), and what the compatibility mode adds (the cross-node device-plugin protocol, which the
default path never imports), beside the device-plugin server. Not a timing: no floor needed.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from tests.harness.controlplane import REPO_ROOT

MODES: dict[str, tuple[str, ...]] = {
    "DRA default (shared devices: slices, claims, classes, the choice)": (
        "agent/dra/*.py", "controller/dra/device_classes.py", "controller/dra/instance_classes.py",
        "controller/dra/shared_allocation.py", "crds/dra.py", "crds/dra_features.py",
    ),
    "device-plugin slots, both modes (local devices: claims, reservations, freeing)": (
        "agent/deviceplugins/slots/*.py", "crds/pinning.py",
    ),
    "compatibility mode only (the cross-node protocol, agent/deviceplugins/crossnode, loaded on "
    "demand)": (
        "agent/deviceplugins/crossnode/*.py", "controller/brokers/pinned_demand.py",
    ),
    "shared by both (kubelet device-plugin server)": (
        "agent/deviceplugins/kubelet/*.py",
    ),
}


def product_lines(path: Path) -> int:
    """Lines that are code: not blank, not only a comment, not inside a docstring."""
    source = path.read_text()
    docstring_lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docstring_lines.update(range(first.lineno, (first.end_lineno or 0) + 1))
    code_lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                          tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        code_lines.update(range(token.start[0], token.end[0] + 1))
    return len(code_lines - docstring_lines)


def main(argv: list[str]) -> None:
    del argv
    for mode, patterns in MODES.items():
        files = sorted({p for pattern in patterns for p in REPO_ROOT.glob(pattern)
                        if not p.name.endswith("_pb2.py") and not p.name.endswith("_grpc.py")})
        counts = {f.relative_to(REPO_ROOT): product_lines(f) for f in files}
        print(f"  {mode}: {sum(counts.values())} product lines in {len(counts)} files")
        for name, count in sorted(counts.items(), key=lambda item: -item[1]):
            print(f"    {count:5d}  {name}")
