"""tally.certs: the generated pair serves TLS that a client trusting only the CA accepts."""

from __future__ import annotations

import asyncio
import ssl
import stat
from pathlib import Path

import pytest

from tally.certs import generate_serving_certificate

pytestmark = pytest.mark.unit


async def _handshake(cert_dir: Path, server_name: str) -> bytes:
    generated = generate_serving_certificate(cert_dir, ["127.0.0.1", "tally.tally-system.svc"])
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(generated.certfile, generated.pkeyfile)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_context)
    port = server.sockets[0].getsockname()[1]
    client_context = ssl.create_default_context(cafile=str(generated.cafile))
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=client_context, server_hostname=server_name
        )
        data = await reader.read()
        writer.close()
        return data
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    "server_name",
    [pytest.param("127.0.0.1", id="ip-san"), pytest.param("tally.tally-system.svc", id="dns-san")],
)
async def test_a_client_trusting_the_ca_accepts_every_san(tmp_path: Path, server_name: str) -> None:
    assert await _handshake(tmp_path, server_name) == b"ok"


async def test_a_name_outside_the_sans_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        await _handshake(tmp_path, "elsewhere.example")


def test_the_key_is_private_to_the_owner(tmp_path: Path) -> None:
    generated = generate_serving_certificate(tmp_path, ["127.0.0.1"])
    assert stat.S_IMODE(generated.pkeyfile.stat().st_mode) == 0o600
    assert generated.cafile.read_bytes() == generated.ca_pem


def test_no_hosts_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one host"):
        generate_serving_certificate(tmp_path, [])
