"""Ray actors, for real: a local Ray cluster (``ray.init(num_cpus=2)``), one actor per lane
of one store on S3 (a real moto server), a learner sampling prioritized batches across the
lanes and feeding priorities back, and an actor killed mid-write that Ray restarts.

Every row and every sample is checked byte for byte against what its writer wrote
(``testing.data``); "nothing committed is lost": every row a reader saw committed before
the kill is still there, intact, afterwards.
"""

from __future__ import annotations

import time

import pytest

import expstore as es
from expstore.storage.format import read_state
from expstore.testing import data
from expstore.testing.ray_actors import LaneActor, learn

ray = pytest.importorskip("ray")
pytest.importorskip("s3fs")


@pytest.fixture(scope="module")
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def call_when_back(method, timeout: float = 120.0):
    """``method.remote()``'s result once the restarting actor answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get(method.remote(), timeout=timeout)
        except ray.exceptions.ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.slow  # ~11 s: a Ray cluster, actors killed
def test_lane_actors_survive_kill_and_restart(ray_cluster, s3_url):
    url, so = s3_url
    es.create(url, data.spec(), capacity=2 * 256, lanes=2, shard_rows=32,
              storage_options=so).close()
    Actor = ray.remote(num_cpus=0.5, max_restarts=1, max_task_retries=0)(LaneActor)
    actors = [Actor.remote(url, lane, so) for lane in range(2)]
    first = ray.get([a.write.remote(120) for a in actors], timeout=120)
    assert [f["committed"] for f in first] == [f["count"] for f in first]
    pid0 = first[0]["pid"]

    # lane 0 writes on while the learner samples both lanes; then lane 0's actor is killed
    pending = actors[0].write.remote(5000, per=10, flush_every=1, pause=0.02)
    reader = es.open(url, storage_options=so)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        reader.refresh()
        if int(reader.index.count[0]) > first[0]["count"] + 40:
            break
        time.sleep(0.2)
    got = learn(url, so, batches=4, batch_size=32)
    assert got["samples"] == 4 * 32 and got["lanes"] == [0, 1]
    seen = read_state(reader.backend, 0).count  # committed rows of lane 0 before the kill
    assert seen > first[0]["count"]
    ray.kill(actors[0], no_restart=False)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(pending, timeout=60)

    # Ray restarted the actor: a new process took the lane's lease over and resumed at the
    # last committed row, with nothing committed lost
    info = call_when_back(actors[0].info)
    assert info["pid"] != pid0 and info["start"] >= seen
    after = ray.get(actors[0].write.remote(60), timeout=120)
    ray.get([a.close.remote() for a in actors], timeout=60)

    store = es.open(url, storage_options=so)
    assert int(store.index.count[0]) == after["count"] >= seen + 60
    assert data.check_lane(store, 0, starts={0, info["start"]}) == len(store.index.lane_rows(
        0, range(int(store.index.lower_bound()[0]), int(store.index.count[0]))))
    assert data.check_lane(store, 1, starts={0}) > 0
    got = learn(url, so, batches=3, batch_size=32)
    assert got["samples"] == 3 * 32 and got["lanes"] == [0, 1]
    store.close()
    reader.close()
