"""``edgeplug discover -f configuration.yaml``: what the agent would publish, found on this machine.

Runs the Configuration's handler here, with no cluster, and prints each device as the agent
would publish it (``--watch``: every change); ``--property NAME=VALUE`` gives the discovery
properties a cluster would read from Secrets or ConfigMaps. Bad ``discoveryDetails`` exit with
status 2 and the handler's message. docs/handlers.md says what is printed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from crds import dra
from crds.api import CONFIGURATION_KIND
from crds.configuration import Configuration, ValueSourceKind
from crds.naming import cdi_name, name_digest, plan_names
from discovery_handlers.contract import (
    Device,
    InvalidDetails,
    PropertyValue,
    Secret,
    is_shared,
)
from discovery_handlers.registry import BrokenHandler, UnknownHandler, load_handler

#: How long the first device list may take before ``discover`` gives up (seconds).
DEFAULT_FIRST_LIST_TIMEOUT = 30.0
MASK = "<redacted>"
EXIT_USAGE = 2
EXIT_NO_LIST = 1


class DiscoverError(Exception):
    """A problem the user must fix; the message says what and where."""


@dataclass(frozen=True)
class Request:
    path: Path
    node: str
    properties: Mapping[str, str]
    watch: bool
    output: str
    timeout: float


def load_configuration(path: Path) -> Configuration:
    """The (first) Configuration in a YAML file; Akri's ``akri.sh/v0`` ones are accepted too."""
    try:
        documents = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
    except (OSError, yaml.YAMLError) as error:
        raise DiscoverError(f"cannot read {path}: {error}") from error
    for document in documents:
        if isinstance(document, dict) and document.get("kind") == CONFIGURATION_KIND:
            try:
                return Configuration.from_object(
                    {**document, "metadata": {"namespace": "default", **document["metadata"]}}
                )
            except (KeyError, TypeError, ValueError) as error:
                raise DiscoverError(f"{path}: not a valid Configuration: {error!r}") from error
    raise DiscoverError(f"{path}: no document of kind {CONFIGURATION_KIND}")


def resolve_properties(
    configuration: Configuration, given: Mapping[str, str]
) -> dict[str, PropertyValue]:
    """Literal values, with ``--property`` values for ``valueFrom`` ones (and overrides)."""
    values: dict[str, PropertyValue] = {}
    for index, prop in enumerate(configuration.spec.discovery_handler.discovery_properties):
        source = prop.value_from
        if prop.name in given:
            text = given[prop.name]
            secret = source is not None and source.kind is ValueSourceKind.SECRET
            values[prop.name] = Secret(text.encode("utf-8")) if secret else text
        elif source is None:
            values[prop.name] = prop.value or ""
        elif not source.optional:
            raise DiscoverError(
                f"discoveryProperties[{index}] ({prop.name}) reads {source.kind} "
                f"{source.name}/{source.key}, which needs a cluster: give it with "
                f"--property {prop.name}=VALUE"
            )
    return values


def describe(
    configuration: Configuration, devices: Sequence[Device], *, shared: bool, node: str,
    secrets: Sequence[bytes],
) -> list[dict[str, Any]]:
    """Each device as the agent would publish it (secrets masked)."""
    rows = []
    plan = plan_names(configuration.name, [d.id for d in devices], shared=shared, node=node)
    for device in devices:
        planned = plan[device.id]
        name = planned.name or planned.akri_name  # nothing is held without a cluster
        properties = {**device.properties, **configuration.spec.broker_properties}
        shown = {k: _masked(v, secrets) for k, v in properties.items()}
        attrs = dra.attributes(namespace=configuration.namespace or "default",
                               configuration=configuration.name, instance=name,
                               properties=shown, reserved=1 if shared else 0)
        rows.append({
            "id": device.id,
            "instance": name,
            "deviceDigest": planned.digest,
            # The device of this list that keeps the Akri name this one would share ("": none).
            "akriNameOf": planned.akri_holder,
            "cdiName": cdi_name(configuration.name, name_digest(name)),
            "healthy": device.health.healthy,
            "reason": device.health.reason,
            "properties": {k: _masked(v, secrets) for k, v in sorted(properties.items())},
            "deviceSpecs": [
                {"hostPath": s.host_path, "containerPath": s.container_path,
                 "permissions": s.permissions}
                for s in device.device_specs
            ],
            "mounts": [
                {"hostPath": m.host_path, "containerPath": m.container_path,
                 "readOnly": m.read_only}
                for m in device.mounts
            ],
            # With DRA on (docs/dra.md): what claims can select by, and what did not fit.
            "draAttributes": dict(sorted({**attrs.values, **attrs.standard}.items())),
            "draLeftOut": list(attrs.left_out),
        })
    return rows


def _masked(value: str, secrets: Sequence[bytes]) -> str:
    encoded = value.encode("utf-8", "surrogateescape")
    return MASK if any(s and s in encoded for s in secrets) else value


def print_text(out: TextIO, header: str, rows: Sequence[Mapping[str, Any]]) -> None:
    print(header, file=out)
    for row in rows:
        health = "healthy" if row["healthy"] else f"UNHEALTHY: {row['reason']}"
        print(f"- device {row['id']} ({health})", file=out)
        print(f"    instance: {row['instance']}", file=out)
        if row["akriNameOf"]:
            print(f"    (its Akri name is device {row['akriNameOf']}'s: this list has both; "
                  f"device digest {row['deviceDigest']})", file=out)
        print(f"    cdi name: {row['cdiName']}", file=out)
        for key, value in row["properties"].items():
            print(f"    property {key}={value}", file=out)
        for spec in row["deviceSpecs"]:
            print(f"    device node {spec['hostPath']} -> {spec['containerPath']} "
                  f"({spec['permissions']})", file=out)
        for mount in row["mounts"]:
            mode = "ro" if mount["readOnly"] else "rw"
            print(f"    mount {mount['hostPath']} -> {mount['containerPath']} ({mode})", file=out)
        for key, value in row["draAttributes"].items():
            print(f"    DRA attribute {key}={value}", file=out)
        for key in row["draLeftOut"]:
            print(f"    DRA: property {key} left out (over the API's limits)", file=out)
    out.flush()


async def discover(request: Request, out: TextIO) -> int:
    """Run the handler and print; returns the exit status."""
    configuration = load_configuration(request.path)
    info = configuration.spec.discovery_handler
    try:
        handler = load_handler(info.name)
    except (UnknownHandler, BrokenHandler) as error:
        raise DiscoverError(str(error)) from error
    properties = resolve_properties(configuration, request.properties)
    try:
        details = handler.parse_details(info.discovery_details, properties)
    except InvalidDetails as error:
        raise DiscoverError(f"Configuration {configuration.name}: {error}") from error
    shared = is_shared(handler, details)
    secrets = [v.value for v in properties.values() if isinstance(v, Secret)]
    stream = handler.discover(details)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with contextlib.aclosing(stream):  # type: ignore[type-var]
        first = True
        while True:
            try:
                if first:
                    async with asyncio.timeout(request.timeout):
                        devices = await anext(stream)
                else:
                    devices = await anext(stream)
            except TimeoutError:
                print(f"edgeplug discover: no device list from handler {info.name!r} within "
                      f"{request.timeout:g} s", file=sys.stderr)
                return EXIT_NO_LIST
            except StopAsyncIteration:
                return 0
            rows = describe(configuration, devices, shared=shared, node=request.node,
                            secrets=secrets)
            elapsed = loop.time() - started
            if request.output == "json":
                print(json.dumps({
                    "configuration": configuration.name, "handler": info.name,
                    "shared": shared, "node": request.node, "seconds": round(elapsed, 3),
                    "devices": rows,
                }), file=out, flush=True)
            else:
                header = (f"# {configuration.name}: handler {info.name}, "
                          f"{'shared' if shared else f'local to node {request.node}'}, "
                          f"{len(rows)} device(s) after {elapsed:.2f} s")
                print_text(out, header, rows)
            if not request.watch:
                return 0
            first = False


def add_arguments(parser: Any) -> None:
    parser.add_argument("-f", "--filename", required=True, type=Path,
                        help="a YAML file holding the Configuration")
    parser.add_argument("--watch", action="store_true",
                        help="keep running and print every change of the device list")
    parser.add_argument("--node", default=socket.gethostname(),
                        help="node name used in the names of local devices' Instances "
                             "(default: this host's name)")
    parser.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                        help="a discovery property's value (for valueFrom ones); repeatable")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text",
                        help="text (default) or one JSON object per device list")
    parser.add_argument("--timeout", type=float, default=DEFAULT_FIRST_LIST_TIMEOUT,
                        help="seconds to wait for the first device list (default: "
                             f"{DEFAULT_FIRST_LIST_TIMEOUT:g})")


def run(args: Any) -> int:
    given: dict[str, str] = {}
    for item in args.property:
        name, sep, value = item.partition("=")
        if not sep or not name:
            print(f"edgeplug discover: --property wants NAME=VALUE, got {item!r}",
                  file=sys.stderr)
            return EXIT_USAGE
        given[name] = value
    request = Request(path=args.filename, node=args.node, properties=given, watch=args.watch,
                      output=args.output, timeout=args.timeout)
    try:
        return asyncio.run(discover(request, sys.stdout))
    except DiscoverError as error:
        print(f"edgeplug discover: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 0
