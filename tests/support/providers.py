"""Credentials for APNs and FCM provider blocks whose endpoints nothing answers.

For daemon processes whose tests register APNs and FCM tokens but never need a
send to arrive: the keys are made here, and both providers point at
:data:`NOWHERE`.
"""

from __future__ import annotations

import json

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

NOWHERE = "https://127.0.0.1:9"
"""Where APNs and FCM are configured: no send goes to them in this test."""


def provider_credentials() -> dict[str, str]:
    """An APNs .p8 key and an FCM service account, as the environment gives them."""
    p8 = (
        ec.generate_private_key(ec.SECP256R1())
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    rsa_pem = (
        rsa.generate_private_key(public_exponent=65537, key_size=2048)
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    account = {
        "type": "service_account",
        "project_id": "identity-test",
        "private_key_id": "k1",
        "private_key": rsa_pem,
        "client_email": "push@identity-test.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": f"{NOWHERE}/token",
    }
    return {"BOTHY_TEST_APNS_KEY": p8, "BOTHY_TEST_FCM": json.dumps(account)}


def provider_blocks() -> dict[str, dict[str, str]]:
    """``push.apns`` and ``push.fcm`` reading :func:`provider_credentials`' variables."""
    return {
        "apns": {
            "key": "env:BOTHY_TEST_APNS_KEY",
            "key_id": "KEY123ABCD",
            "team_id": "TEAM12345X",
            "bundle_id": "com.example.chat",
            "endpoint": NOWHERE,
        },
        "fcm": {"service_account": "env:BOTHY_TEST_FCM", "endpoint": NOWHERE},
    }
