"""Camera credentials from ``discoveryProperties``, looked up by camera uuid as Akri's handler
does.

``parse_credentials`` reads the three sources in Akri's order; ``CredentialStore.lookup`` gives a
camera's credential (its uuid, then the default). No value ever reaches an exception or a ``repr``.
Sources and rules: docs/handlers/onvif.md, "Credentials (`discoveryProperties`)".
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from discovery_handlers.contract import InvalidDetails, PropertyValue, property_text

CREDENTIAL_LIST = "device_credential_list"
CREDENTIAL_REF_LIST = "device_credential_ref_list"
USERNAME_PREFIX = "username_"
PASSWORD_PREFIX = "password_"
DEFAULT_KEY = "default"


@dataclass(frozen=True)
class Credential:
    """A username and password; neither is shown by ``repr``."""

    username: str = field(repr=False)
    password: str = field(repr=False)


@dataclass(frozen=True)
class CredentialStore:
    """Credentials by normalised camera uuid, plus an optional default."""

    by_uuid: Mapping[str, Credential] = field(default_factory=dict, repr=False)
    default: Credential | None = field(default=None, repr=False)

    def lookup(self, uuid: str) -> Credential | None:
        """The credential for the camera ``uuid`` (any spelling), else the default, else None."""
        return self.by_uuid.get(credential_key(uuid), self.default)

    def __repr__(self) -> str:
        return f"CredentialStore(<{len(self.by_uuid)} cameras, default={self.default is not None}>)"


def credential_key(uuid: str) -> str:
    """One spelling of a uuid for lookups: lower case, ``_`` read as ``-``, no ``urn:uuid:``."""
    value = uuid.strip().lower().replace("_", "-")
    for prefix in ("urn:uuid:", "uuid:"):
        value = value.removeprefix(prefix)
    return value


def parse_credentials(properties: Mapping[str, PropertyValue]) -> CredentialStore:
    """Read every credential source from the resolved discovery properties."""
    found: dict[str, Credential] = {}
    for name in _name_list(properties, CREDENTIAL_LIST):
        for position, (key, entry) in enumerate(_json_map(properties, name).items(), start=1):
            found[credential_key(key)] = _listed_credential(name, position, entry)
    for name in _name_list(properties, CREDENTIAL_REF_LIST):
        for position, (key, entry) in enumerate(_json_map(properties, name).items(), start=1):
            found[credential_key(key)] = _referenced_credential(properties, name, position,
                                                                entry)
    for prop in properties:
        if prop.startswith(USERNAME_PREFIX):
            uuid = prop[len(USERNAME_PREFIX) :]
            found[credential_key(uuid)] = Credential(
                username=property_text(properties, prop) or "",
                password=property_text(properties, PASSWORD_PREFIX + uuid) or "",
            )
    default = found.pop(DEFAULT_KEY, None)
    return CredentialStore(by_uuid=found, default=default)


def _name_list(properties: Mapping[str, PropertyValue], prop: str) -> list[str]:
    text = _text(properties, prop)
    if text is None:
        return []
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidDetails(
            f"discoveryProperties.{prop}", "must be a JSON list of discovery property names"
        )
    for position, name in enumerate(value, start=1):
        if name not in properties:
            raise InvalidDetails(
                f"discoveryProperties.{prop}",
                f"entry {position} is not the name of a discovery property",
            )
    return value


def _json_map(properties: Mapping[str, PropertyValue], prop: str) -> dict[str, Any]:
    text = _text(properties, prop) or ""
    try:
        value: Any = json.loads(text)
    except ValueError:
        value = None  # the parser's message would quote the secret text: never shown
    if not isinstance(value, dict):
        raise InvalidDetails(
            f"discoveryProperties.{prop}",
            "must be a JSON object mapping camera uuids to credentials",
        )
    return value


def _listed_credential(prop: str, position: int, entry: Any) -> Credential:
    where, which = f"discoveryProperties.{prop}", f"entry {position}"
    if not isinstance(entry, dict) or not isinstance(entry.get("username"), str):
        raise InvalidDetails(where, f"{which} must be an object with a string 'username'")
    password = entry.get("password", "")
    if not isinstance(password, str):
        raise InvalidDetails(where, f"{which}: 'password' must be a string")
    if entry.get("base64encoded") is True:
        try:
            password = base64.b64decode(password, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise InvalidDetails(where, f"{which}: 'password' is not base64-encoded UTF-8"
                                 ) from None
    return Credential(username=entry["username"], password=password)


def _referenced_credential(
    properties: Mapping[str, PropertyValue], prop: str, position: int, entry: Any
) -> Credential:
    where, which = f"discoveryProperties.{prop}", f"entry {position}"
    if not isinstance(entry, dict) or not isinstance(entry.get("username_ref"), str):
        raise InvalidDetails(where, f"{which} must be an object with a string 'username_ref'")
    username_ref = entry["username_ref"]
    password_ref = entry.get("password_ref")
    if username_ref not in properties:
        raise InvalidDetails(where, f"{which}: 'username_ref' is not the name of a discovery"
                                    " property")
    if password_ref is not None and not isinstance(password_ref, str):
        raise InvalidDetails(where, f"{which}: 'password_ref' must be a property name")
    return Credential(
        username=property_text(properties, username_ref) or "",
        password=(property_text(properties, password_ref) or "") if password_ref else "",
    )


def _text(properties: Mapping[str, PropertyValue], prop: str) -> str | None:
    try:
        return property_text(properties, prop)
    except ValueError:
        raise InvalidDetails(f"discoveryProperties.{prop}", "is not UTF-8 text") from None
