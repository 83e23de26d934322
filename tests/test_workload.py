"""The demo workload against real brokers."""

import threading

from kinspect.workload import WorkloadResult, run_forever, run_workload


def test_run_workload_on_tansu(tansu):
    assert run_workload(tansu.bootstrap, messages=20) == WorkloadResult(20, 20, 1)


def test_run_workload_twice_reuses_topic_and_group(noida):
    for _ in range(2):
        assert run_workload(noida.bootstrap, messages=5) == WorkloadResult(5, 5, 1)


def test_run_forever_until_stopped(noida):
    stop = threading.Event()
    timer = threading.Timer(2.0, stop.set)
    timer.start()
    try:
        result = run_forever(noida.bootstrap, stop, interval=0.2, messages=4)
    finally:
        timer.cancel()
    assert result.rounds >= 2
    # A stop during the last round may leave that round's messages unconsumed.
    assert result.produced in (4 * result.rounds, 4 * result.rounds + 4)
    assert 4 * result.rounds <= result.consumed <= result.produced
