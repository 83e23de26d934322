"""Shared fixtures: real brokers (Tansu, noida-db), free ports, unique names.

Function-scoped brokers (``tansu``, ``noida``) are fresh for each test; the
session-scoped ones (``tansu_session``, ``noida_session``) are shared, so tests
using them must pick unique topic and group names (``unique``). When a test
fails, the logs of the brokers it used are added to its report.
"""

from __future__ import annotations

import uuid

import pytest

from kinspect.brokers import Broker, NoidaBroker, TansuBroker
from kinspect.brokers import free_port as _free_port


@pytest.fixture
def free_port() -> int:
    """A loopback TCP port that is free when the test starts."""
    return _free_port()


@pytest.fixture
def unique():
    """``unique("topic")`` gives a name no other test uses, e.g. ``topic-1f2e3d4c``."""
    return lambda prefix: f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def tansu():
    """A fresh Tansu broker for this test."""
    with TansuBroker() as broker:
        yield broker


@pytest.fixture
def noida():
    """A fresh noida-db (Kafka service only) for this test."""
    with NoidaBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def tansu_session():
    """One Tansu broker shared by the whole session: use unique topic names."""
    with TansuBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def noida_session():
    """One noida-db shared by the whole session: use unique topic names."""
    with NoidaBroker() as broker:
        yield broker


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Append the logs of a failed test's brokers to its report."""
    report = yield
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, Broker):
                log = value.log_text()
                report.sections.append((f"{name} log ({value.bootstrap})", log[-8000:]))
    return report
