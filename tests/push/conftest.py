"""Fixtures of the provider tests: one test CA, an APNs signing key, and the fakes
(APNs over HTTP/2, FCM with its token endpoint, a webhook receiver), each serving
TLS on 127.0.0.1 port 0 inside the test's nursery."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
import trio
import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from bothy_notify.kernel.clock import FakeClock
from testkit.fakes.apns import FakeApns
from testkit.fakes.fcm import FakeFcm

KEY_ID = "KEY123ABCD"
TEAM_ID = "TEAM12345X"
TOPIC = "com.example.chat"


@dataclass(frozen=True)
class ApnsKey:
    """An APNs .p8-style key for tests."""

    private: ec.EllipticCurvePrivateKey
    pem: str


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="session")
def ca_file(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture(scope="session")
def apns_key() -> ApnsKey:
    private = ec.generate_private_key(ec.SECP256R1())
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return ApnsKey(private, pem)


@pytest.fixture
def now_clock() -> FakeClock:
    """A fake clock that starts at the real time (signatures receivers check against it)."""
    return FakeClock(datetime.now(UTC).replace(microsecond=0))


@pytest.fixture
async def fake_apns(
    nursery: trio.Nursery, ca: trustme.CA, apns_key: ApnsKey, now_clock: FakeClock
) -> AsyncIterator[FakeApns]:
    fake = FakeApns(
        ca=ca,
        public_key=apns_key.private.public_key(),
        key_id=KEY_ID,
        team_id=TEAM_ID,
        topic=TOPIC,
        clock=now_clock.now,
    )
    await nursery.start(fake.serve)
    yield fake
    assert fake.violations == [], "the provider broke an APNs rule"


@pytest.fixture(scope="session")
def fcm_key() -> rsa.RSAPrivateKey:
    """The service account's RSA key (made once: 2048-bit generation is slow)."""
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
async def fake_fcm(
    nursery: trio.Nursery, ca: trustme.CA, fcm_key: rsa.RSAPrivateKey
) -> AsyncIterator[FakeFcm]:
    fake = FakeFcm(ca=ca, key=fcm_key)
    await nursery.start(fake.serve)
    yield fake
    assert fake.violations == [], "the provider broke an FCM rule"
