"""The kubernetes-asyncio client tally uses for its own reads and writes.

Kopf logs in on its own for watching; tally's controllers and the admission webhook write
through one shared ``ApiClient`` made here. In a pod it uses the service account, elsewhere the
kubeconfig (``KUBECONFIG`` or ``~/.kube/config``), the same order Kopf tries.
"""

from __future__ import annotations

from kubernetes_asyncio import client, config


async def make_api_client() -> client.ApiClient:
    """One ``ApiClient`` for the process; the caller closes it on shutdown."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException:
        await config.load_kube_config(client_configuration=configuration)
    return client.ApiClient(configuration)


async def server_version(api: client.ApiClient) -> str:
    """The API server's ``gitVersion`` (one GET /version, with a timeout)."""
    info = await client.VersionApi(api).get_code(_request_timeout=10)
    return str(info.git_version)
