"""Where the model may not reach: a page the model asks for (or a search returns) is fetched only where its host's
every address is public, so that the model never becomes a way into the user's machine or network (loopback,
private, link-local, shared and reserved ranges are refused); `--web_allow_private` lifts it, for intranets and tests.
Each redirect's address is checked again (web/pages.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from local_chat.errors import UserError

ALLOW_FLAG = "--web_allow_private"


def is_public(address: str) -> bool:
    """Whether an IP address is on the public internet (an IPv4 address inside IPv6 judged as itself)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


async def checked_url(url: str, allow_private: bool) -> str:
    """`url` where it may be fetched: http or https, a host that resolves, and (unless `allow_private`) every one of
    its addresses public; else `UserError` with the sentence that says why."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(f"{url} is not an http:// or https:// address, so it was not fetched.")
    if allow_private:
        return url
    host = parts.hostname
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, ValueError) as error:
        raise UserError(f"The host of {url} cannot be found ({error}), so it was not fetched.")
    if not all(is_public(info[4][0]) for info in found):
        raise UserError(
            f"{host} is this machine or a private network's address, so the model may not fetch it ({ALLOW_FLAG} "
            "allows it)."
        )
    return url
