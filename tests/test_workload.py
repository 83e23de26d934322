"""The demo workload against real brokers."""

import threading

from kinspect.workload import WorkloadResult, run_forever, run_workload


def test_run_workload_on_tansu(tansu):
    assert run_workload(tansu.bootstrap, messages=20) == WorkloadResult(20, 20, 1)


def test_run_workload_twice_reuses_topic_and_group(noida):
    for _ in range(2):
        assert run_workload(noida.bootstrap, messages=5) == WorkloadResult(5, 5, 1)


class _StopDuringThirdRound(threading.Event):
    """Set from another thread just after the second round (not after a time: a slow
    machine may need seconds per round), so the stop lands in the third round or
    between rounds."""

    def __init__(self) -> None:
        super().__init__()
        self.waits = 0
        self.timer = threading.Timer(0.05, self.set)

    def wait(self, timeout=None):
        self.waits += 1  # run_forever waits after each round
        if self.waits == 2:
            self.timer.start()
        return super().wait(timeout)


def test_run_forever_until_stopped(noida):
    stop = _StopDuringThirdRound()
    try:
        result = run_forever(noida.bootstrap, stop, interval=0.2, messages=4)
    finally:
        stop.timer.cancel()
    assert result.rounds >= 2
    # A stop during the last round may leave that round's messages unconsumed.
    assert result.produced in (4 * result.rounds, 4 * result.rounds + 4)
    assert 4 * result.rounds <= result.consumed <= result.produced
