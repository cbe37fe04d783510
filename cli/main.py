"""``edgeplug``: the small user CLI (the `cli` package; the API it reads is `crds`).

``edgeplug crds | kubectl apply -f -`` installs the CRDs from the installed package (no repo
checkout needed); ``edgeplug instance-name`` predicts an Instance's name the way the agent will
compute it, for GitOps users who request ``edgeplug.io/<instance>`` before the device shows up
(``--all``: every name it may take, in order, its collision name among them, docs/naming.md);
``edgeplug discover -f configuration.yaml`` runs the Configuration's handler on this machine and
prints what the agent would publish (``cli.discover``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cli import discover
from crds.api import manifests_text
from crds.naming import instance_name, instance_names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edgeplug", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("crds", help="print the CRD manifests (pipe into kubectl apply -f -)")
    name = commands.add_parser("instance-name", help="print the Instance name of a device")
    name.add_argument("configuration", help="the Configuration's name")
    name.add_argument("device_id", help="the id the discovery handler gives the device")
    name.add_argument("--node", default="", help="node that sees the device (local devices)")
    name.add_argument("--shared", action="store_true", help="the device is shared across nodes")
    name.add_argument("--all", action="store_true",
                      help="print every name the device may take, in order (docs/naming.md)")
    discover_command = commands.add_parser(
        "discover", help="run a Configuration's handler here and print what it finds"
    )
    discover.add_arguments(discover_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "crds":
        sys.stdout.write(manifests_text())
        return 0
    if args.command == "discover":
        return discover.run(args)
    if not args.shared and not args.node:
        print("edgeplug: --node is required for a device that is not --shared", file=sys.stderr)
        return 2
    if args.all:
        for each in instance_names(args.configuration, args.device_id, shared=args.shared,
                                   node=args.node):
            print(each)
        return 0
    print(instance_name(args.configuration, args.device_id, shared=args.shared, node=args.node))
    return 0


if __name__ == "__main__":
    sys.exit(main())
