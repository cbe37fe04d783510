"""Registering one plugin with the kubelet over ``kubelet.sock``.

Registration is the only call the plugin makes *to* the kubelet; keeping it in
one function gives one place for the API version, the timeout and the error translation
(a ``RegistrationFailed`` names the resource and the kubelet's status).
"""

from __future__ import annotations

from pathlib import Path

import grpc
from grpc import aio

from agent.kubeletapi import deviceplugin_v1beta1_pb2 as pb
from agent.kubeletapi import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from agent.settings import current

API_VERSION = "v1beta1"
KUBELET_SOCKET_NAME = "kubelet.sock"



class RegistrationFailed(Exception):
    """The kubelet refused the registration or could not be reached."""


async def register(
    *,
    kubelet_socket: Path,
    endpoint: str,
    resource_name: str,
    pre_start_required: bool,
) -> None:
    """Tell the kubelet that ``resource_name`` is served on ``endpoint`` (a socket file name)."""
    request = pb.RegisterRequest(
        version=API_VERSION,
        endpoint=endpoint,
        resource_name=resource_name,
        options=pb.DevicePluginOptions(
            pre_start_required=pre_start_required, get_preferred_allocation_available=True
        ),
    )
    try:
        async with aio.insecure_channel(f"unix://{kubelet_socket}") as channel:
            await pb_grpc.RegistrationStub(channel).Register(
                request, timeout=current().device_plugins.register_timeout_s
            )
    except grpc.RpcError as error:
        code = error.code() if isinstance(error, aio.AioRpcError) else None
        details = error.details() if isinstance(error, aio.AioRpcError) else str(error)
        raise RegistrationFailed(
            f"registering {resource_name} (endpoint {endpoint}) on {kubelet_socket}: "
            f"{code.name if code else 'UNKNOWN'}: {details}"
        ) from error
