"""``kernelstream keygen``'s deployment helpers: a key pair into a Kubernetes Secret.

In a cluster the pair is made by a Job (deploy/k8s/signing-keys-job.yaml) that calls
``kernelstream keygen --k8s-secret kernelstream-signing``: the Secret is created
through the API server with the Job's service account, once; a Secret that already
exists is kept (the Job runs again on every ``kubectl apply``). Workers mount its
``private.pem``, nodes only its ``public.pem``.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["ensure_k8s_secret", "k8s_secret"]

_SA = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_API = "https://kubernetes.default.svc"


def k8s_secret(name: str, namespace: str, private_pem: bytes, public_pem: bytes) -> dict[str, Any]:
    """The Secret object holding the pair (``private.pem``, ``public.pem``)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "kernelstream"},
        },
        "type": "Opaque",
        "data": {
            "private.pem": base64.b64encode(private_pem).decode(),
            "public.pem": base64.b64encode(public_pem).decode(),
        },
    }


def ensure_k8s_secret(name: str, private_pem: bytes, public_pem: bytes) -> bool:
    """Create the Secret in this pod's namespace; False when it already exists.

    Uses the pod's service account (token and CA under
    ``/var/run/secrets/kubernetes.io/serviceaccount``); raises ``OSError`` with the
    API server's answer when it refuses.
    """
    namespace = (_SA / "namespace").read_text().strip()
    token = (_SA / "token").read_text().strip()
    body = json.dumps(k8s_secret(name, namespace, private_pem, public_pem)).encode()
    req = urllib.request.Request(
        f"{_API}/api/v1/namespaces/{namespace}/secrets",
        data=body,
        method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    ctx = ssl.create_default_context(cafile=str(_SA / "ca.crt"))
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=30):
            return True
    except urllib.error.HTTPError as exc:
        if exc.code == 409:  # AlreadyExists: the pair in use stays
            return False
        raise OSError(
            f"creating Secret {namespace}/{name} failed: {exc.code} {exc.read()[:300]!r}"
        ) from exc
