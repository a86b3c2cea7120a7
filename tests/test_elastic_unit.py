"""Elastic pieces that need no MPI job: states, hororun's elastic flags, discovery parsing, the driver's HMAC."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from horo.core.transport import signed
from horo.elastic import HoroInternalError, HorovodInternalError, ObjectState, run
from horo.run.args import UsageError, parse_args
from horo.run.elastic_driver import DiscoveryError, ElasticDriver, HostTable, parse_discovery_output
from horo.run.elastic_proto import BLOB, SERVICE, request

pytestmark = pytest.mark.unit  # no MPI job, no cluster: make test-quick runs it


def _state(**kw):
    return ObjectState(bcast_object=lambda obj, root, name=None: obj, get_rank=lambda: 0, **kw)


def test_object_state_save_restore_and_sync():
    s = _state(epoch=0, w=np.zeros(3))
    s.epoch, s.w = 5, np.ones(3)
    s.restore()  # nothing committed yet: back to the initial values
    assert s.epoch == 0 and not s.w.any()
    s.epoch = 2
    s.w[:] = 7
    s.save()
    s.w[:] = 9  # in-place change after the commit must not leak into the saved copy
    s.restore()
    assert s.epoch == 2 and (s.w == 7).all()
    s.sync()
    assert s.epoch == 2


def test_reset_callbacks_and_bad_arguments():
    s = _state(epoch=0)
    calls = []
    s.register_reset_callbacks([lambda: calls.append(1)])
    s.on_reset()
    assert calls == [1]
    with pytest.raises(TypeError, match="Received: callbacks="):
        s.register_reset_callbacks(lambda: None)
    with pytest.raises(TypeError, match="must be callable"):
        s.register_reset_callbacks([1])
    with pytest.raises(TypeError, match="Received: func=3"):
        run(3)
    assert HorovodInternalError is HoroInternalError


def test_elastic_flags_follow_horovod():
    ns = parse_args(["--min-np", "2", "--max-np", "4", "python", "x.py"])
    assert ns.elastic and ns.np == 2 and ns.min_np == 2 and ns.max_np == 4 and ns.elastic_timeout == 600
    ns = parse_args(["-np", "3", "--min-np", "2", "-H", "a:2,b:2", "--blacklist-cooldown-range", "1", "5",
                     "--reset-limit", "3", "python", "x.py"])
    # With a host list and no --max-np, every slot offered is used (Horovod: no bound); on this machine only,
    # -np is the bound.
    assert ns.max_np is None and ns.cooldown == [1.0, 5.0] and ns.reset_limit == 3
    assert parse_args(["-np", "3", "--min-np", "2", "python", "x.py"]).max_np == 3
    assert not parse_args(["-np", "2", "python", "x.py"]).elastic


@pytest.mark.parametrize("argv, text", [
    (["-np", "5", "--min-np", "2", "--max-np", "4"], "Received: --min-np=2, -np=5, --max-np=4"),
    (["--min-np", "2", "--elastic-timeout", "0"], "Received: --elastic-timeout=0"),
    (["--min-np", "2", "--blacklist-cooldown-range", "5", "1"], "Received: --blacklist-cooldown-range=5 1"),
    (["--min-np", "2", "--host-discovery-script", "/nonexistent"], "--host-discovery-script='/nonexistent'"),
    (["--min-np", "2", "--hostfile", "h"], "Received: --hostfile='h'"),
])
def test_bad_elastic_flags_name_the_value(argv, text):
    with pytest.raises(UsageError, match="Received") as info:
        parse_args([*argv, "python", "x.py"])
    assert text in str(info.value)


def test_discovery_output_and_host_table():
    hosts = parse_discovery_output("localhost:2\n127.0.0.1\n# comment\n\nnode-3:4\n", 3, "s")
    assert hosts == {"localhost": 2, "127.0.0.1": 3, "node-3": 4}
    with pytest.raises(DiscoveryError, match="Received: 'a:x'"):
        parse_discovery_output("a:x\n", None, "s")
    t = HostTable(cooldown=None)
    t.update({"a": 2, "b": 1})
    assert t.claim(2) == ["a", "a"] and t.free_slots() == ["b"]
    assert t.exclude("b") is None and t.free_slots() == []
    t2 = HostTable(cooldown=(0.0, 0.0))
    t2.update({"a": 1})
    assert t2.exclude("a") == 0.0 and t2.free_slots() == ["a"]  # a zero cool-down: back at once


def test_driver_answers_only_signed_requests():
    drv = ElasticDriver(lambda: {"localhost": 2}, 1, 2)
    drv.start()
    try:
        host, port = drv.address.split(":")
        with pytest.raises(signed.Refused, match="does not hold this job's key"):
            request(drv.address, b"wrong key", {"op": "poll"}, timeout=5)  # no answer to a peer without the key
        drv.refresh()
        reply = request(drv.address, drv.key, {"op": "poll"}, timeout=5)
        assert reply["free"] == 2 and reply["max_np"] == 2
        assert host == "127.0.0.1"  # loopback unless the hosts need otherwise
    finally:
        drv.stop()


def test_driver_tells_apart_workers_that_share_a_pid_on_different_hosts():
    """Hosts with their own PID namespaces (containers, the test bed) reuse pids: the key is (host, pid)."""
    logs: list[str] = []
    driver = ElasticDriver(lambda: {"a": 1, "b": 1, "c": 1}, 2, 3, log=logs.append)
    try:
        driver.refresh()
        driver._world([["a", "ha", 7], ["b", "hb", 7], ["c", "hc", 7]])  # noqa: SLF001
        assert driver.table.in_use == {"a": 1, "b": 1, "c": 1}
        driver._world([["a", "ha", 7], ["b", "hb", 7]])  # noqa: SLF001 - c's worker died
        assert [(host, pid) for _t, host, pid in driver.failures] == [("c", 7)]
        assert driver.table.in_use == {"a": 1, "b": 1}
        assert any("on host c failed; c is excluded" in m for m in logs), logs
    finally:
        driver.stop()


def test_driver_grows_the_world_on_this_machine_only():
    """Spawning onto another host hangs or fails in Open MPI 5 (docs/design-elastic.md): the driver offers
    only local slots for growth, says so once, and still places workers on every host at the start."""
    logs: list[str] = []
    driver = ElasticDriver(lambda: {"localhost": 1, "nodeb": 2}, 1, 4, log=logs.append)
    try:
        # Horovod's start: wait for -np slots, then take every slot up to --max-np.
        assert driver.initial_assignment(2, 5.0) == ["localhost", "nodeb", "nodeb"]
        assert driver.handle({"op": "poll"})["free"] == 0
        driver.table.update({"localhost": 1, "nodeb": 3})  # one slot more, on the other host
        assert driver.handle({"op": "claim", "size": 3}) == {"hosts": []}
        driver.handle({"op": "poll"})
        told = [m for m in logs if m.startswith("not growing onto ['nodeb']")]
        assert len(told) == 1, logs
        driver.table.update({"localhost": 2, "nodeb": 3})
        assert driver.handle({"op": "claim", "size": 3}) == {"hosts": ["localhost"]}
    finally:
        driver.stop()


def test_signed_messages_carry_a_binary_payload_and_refuse_a_changed_one():
    import threading

    a, b = socket.socketpair()
    try:
        server: list[signed.Conn] = []
        t = threading.Thread(target=lambda: server.append(signed.accept(b, b"k" * 32, SERVICE)))
        t.start()
        client = signed.client(a, b"k" * 32, SERVICE)
        t.join()
        blob = bytes(range(256)) * 5000 + b"\n end"  # bigger than a socket buffer, with a newline inside
        sender = threading.Thread(target=client.send, args=({"op": "commit", BLOB: blob},))
        sender.start()
        assert server[0].recv(wait=10) == {"op": "commit", BLOB: blob}
        sender.join()
        frame = client._frame({"op": "commit", BLOB: b"abc"}, 0)  # noqa: SLF001 - the bytes on the wire
        assert frame[:-32].endswith(b"abc")  # the payload follows the body, as raw bytes, then its MAC
        a.sendall(frame[:-35] + b"abd" + frame[-32:])  # the signed header and body with another payload
        with pytest.raises(signed.Refused, match="does not match its signed header"):
            server[0].recv(wait=10)
    finally:
        a.close()
        b.close()


def test_driver_keeps_the_last_commit_and_forgets_a_lost_hosts_workers():
    """A whole host lost ends the MPI job: the driver keeps rank 0's last commit for the job it restarts, and
    records the lost host's workers as failed, so they are not counted again when the new job reports."""
    logs: list[str] = []
    driver = ElasticDriver(lambda: {"a": 1, "b": 1, "c": 1}, 2, 3, log=logs.append)
    try:
        assert driver.handle({"op": "resume"}) == {"ok": False}
        driver.handle({"op": "commit", BLOB: b"one"})
        driver.handle({"op": "commit", BLOB: b"two"})
        assert driver.handle({"op": "resume"}) == {"ok": True, BLOB: b"two"}
        driver.refresh()
        driver._world([["a", "ha", 7], ["b", "hb", 7], ["c", "hc", 7]])  # noqa: SLF001
        assert driver.world_reports == 1
        assert driver.lose_hosts(["hc"]) == ["c"]
        assert [(host, pid) for _t, host, pid in driver.failures] == [("c", 7)]
        assert driver.members == {} and driver.world_reports == 0
        assert driver.initial_assignment(2, 1.0) == ["a", "b"]  # c is excluded for good
        driver._world([["a", "ha", 9], ["b", "hb", 9]])  # noqa: SLF001 - the restarted job
        assert len(driver.failures) == 1
        assert any("host c was lost (its Open MPI daemon too); c is excluded" in m for m in logs), logs
        driver.handle({"op": "commit", "unsupported": "MyState"})
        assert driver.state_unsupported == "MyState"
    finally:
        driver.stop()


def test_object_state_round_trips_its_commit_through_pickle():
    import pickle

    state = ObjectState(bcast_object=lambda obj, root, name=None: obj, get_rank=lambda: 0, epoch=3, w=np.ones(2))
    state.epoch, state.w = 9, np.zeros(2)
    value = pickle.loads(pickle.dumps(state.committed()))
    other = ObjectState(bcast_object=lambda obj, root, name=None: obj, get_rank=lambda: 0, epoch=0, w=None)
    other.load_committed(value)
    other.restore()
    assert other.epoch == 3 and np.array_equal(other.w, np.ones(2))


def test_torch_state_round_trips_its_commit_through_pickle():
    """What a job restarted after a lost host resumes from: model, optimizer and values of the last commit."""
    import pickle

    torch = pytest.importorskip("torch")
    from horo.torch.elastic import TorchState

    def make(seed: int):
        torch.manual_seed(seed)
        model = torch.nn.Linear(3, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.ones(1, 3)).sum().backward()
        opt.step()  # momentum buffers exist
        return model, opt

    model, opt = make(0)
    state = TorchState(model, opt, epoch=4)
    state.commit()
    committed = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)  # after the commit: must not come back
    blob = pickle.dumps(state.committed())
    model2, opt2 = make(1)
    other = TorchState(model2, opt2, epoch=0)
    other.load_committed(pickle.loads(blob))
    other.restore()
    assert other.epoch == 4
    for k, v in model2.state_dict().items():
        assert torch.equal(v, committed[k]), k
    momentum = [o.state_dict()["state"][0]["momentum_buffer"] for o in (opt, opt2)]
    assert torch.equal(*momentum)


def test_a_job_across_hosts_grows_onto_them_by_a_restart():
    """Spawning onto another host fails in Open MPI 5: a job started across hosts is offered those slots as a
    restart (its workers end at a commit, hororun starts it again with them); free local slots still spawn."""
    from horo.elastic import client

    driver = ElasticDriver(lambda: {"localhost": 1, "nodeb": 2}, 1, 4)
    try:
        driver.restart_growth = True
        assert driver.initial_assignment(2, 5.0) == ["localhost", "nodeb", "nodeb"]
        driver.table.update({"localhost": 1, "nodeb": 3})  # discovery offers one slot more, on nodeb
        reply = driver.handle({"op": "poll"})
        assert reply["free"] == 0 and reply["remote_free"] == 1
        driver.handle({"op": "restart"})
        assert driver.restart_requested
        driver.forget_world()
        assert not driver.restart_requested and driver.table.in_use == {}
        driver.initial_assignment(2, 5.0)
        driver.handle({"op": "commit", "unsupported": "MyState"})  # its commit could not be kept: no restart
        assert driver.handle({"op": "poll"})["remote_free"] == 0
    finally:
        driver.stop()
    saved = dict(client._poll)  # noqa: SLF001
    try:
        for free, remote, max_np, size, kind in ((0, 1, 3, 2, 2), (0, 1, 3, 3, 0), (1, 1, 3, 2, 1), (0, 0, 3, 2, 0)):
            client._poll.update(free=free, remote_free=remote, max_np=max_np)  # noqa: SLF001
            assert client.growth_available(size) == kind, (free, remote, max_np, size)
    finally:
        client._poll.clear()  # noqa: SLF001
        client._poll.update(saved)  # noqa: SLF001


def test_keras_state_round_trips_its_commit_into_a_fresh_model():
    """A restarted job's model and optimizer are new (the optimizer not even built): the commit fills both."""
    import pickle

    keras = pytest.importorskip("keras")
    from horo.keras.elastic import KerasState

    def make(seed: int):
        keras.utils.set_random_seed(seed)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
        return model

    model = make(0)
    model.fit(np.ones((4, 3)), np.zeros((4, 2)), epochs=1, verbose=0)  # builds the optimizer's slots
    state = KerasState(model, epoch=2)
    state.commit()
    blob = pickle.dumps(state.committed())
    fresh = make(1)
    assert not fresh.optimizer.built
    other = KerasState(fresh, epoch=0)
    other.load_committed(pickle.loads(blob))
    other.restore()
    assert other.epoch == 2
    for a, b in zip(fresh.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert fresh.optimizer.built
    for a, b in zip(fresh.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))


def test_rank_0_hands_its_commits_to_a_real_driver(monkeypatch):
    """Over the signed socket, in the background: the driver ends up with the newest commit; a State without
    ``committed()`` is named instead, so hororun will not restart from a commit it never had."""
    import pickle

    from horo.elastic import State, client

    drv = ElasticDriver(lambda: {"localhost": 1}, 1, 1)
    drv.start()
    try:
        monkeypatch.setenv("HORO_ELASTIC_DRIVER", drv.address)
        monkeypatch.setenv("HORO_ELASTIC_SECRET", drv.key.hex())
        monkeypatch.setenv("HORO_ELASTIC_KEEP_STATE", "1")
        state = ObjectState(bcast_object=lambda obj, root, name=None: obj, get_rank=lambda: 0, step=0,
                            w=np.zeros(1 << 20))
        for step in range(1, 6):
            state.step = step
            state.save()
            state._keep_at_driver()  # noqa: SLF001 - commit() without its host check (that needs a world)
        assert client.wait_kept(30)
        kept = pickle.loads(drv.committed)
        assert kept["values"]["step"] == 5 and kept["values"]["w"].shape == (1 << 20,)

        class Mine(State):
            def save(self) -> None: ...
            def restore(self) -> None: ...
            def sync(self) -> None: ...

        Mine(bcast_object=lambda obj, root, name=None: obj, get_rank=lambda: 0)._keep_at_driver()  # noqa: SLF001
        assert drv.state_unsupported == "Mine"
    finally:
        drv.stop()


def _driver(hosts: dict[str, int], **kw) -> tuple[ElasticDriver, list[str]]:
    logs: list[str] = []
    table = dict(hosts)
    driver = ElasticDriver(lambda: dict(table), 1, 8, log=logs.append, **kw)
    driver.table_source = table  # type: ignore[attr-defined] - what discovery prints, changed by the test
    driver.refresh()
    return driver, logs


def test_workers_of_a_host_that_discovery_drops_are_told_to_leave():
    """Horovod's semantics: a host no longer listed loses its workers at the next reset; a host listed with
    fewer slots loses its newest workers; the ranks of the others are kept in order."""
    driver, logs = _driver({"a": 2, "b": 2})
    try:
        members = [["a", "m", 1, 0], ["a", "m", 2, 0], ["b", "m", 3, 0], ["b", "m", 4, 0]]
        assert driver._world(members) == {"ok": True, "leave": []}  # noqa: SLF001
        driver.table_source.pop("a")
        driver.table_source["b"] = 1
        driver.refresh()
        assert driver.handle({"op": "poll"})["remove"] == 3
        reply = driver._world(members)  # noqa: SLF001
        assert reply == {"ok": True, "leave": [["m", 1], ["m", 2], ["m", 4]]}
        assert driver.handle({"op": "poll"})["remove"] == 0  # told already: no second interrupt
        assert driver._world([members[2]]) == {"ok": True, "leave": []}  # noqa: SLF001
        assert driver.failures == [], "workers that were told to leave did not fail"
        assert any("3 worker(s) leave at this reset: a (no longer listed by host discovery); b (listed with 1 "
                   "slot(s) now)" in m for m in logs), logs
    finally:
        driver.stop()


def test_a_failed_workers_host_is_excluded_and_its_other_workers_leave():
    driver, logs = _driver({"a": 2, "b": 2})
    try:
        driver._world([["a", "m", 1, 0], ["a", "m", 2, 0], ["b", "m", 3, 0], ["b", "m", 4, 0]])  # noqa: SLF001
        driver.handle({"op": "failed", "host": "a", "real": "m", "pid": 1, "error": "RuntimeError: bad batch"})
        assert any("worker pid 1 on host a raised RuntimeError: bad batch; a is excluded for the rest of the job"
                   in m for m in logs), logs
        reply = driver._world([["a", "m", 2, 1], ["b", "m", 3, 1], ["b", "m", 4, 1]])  # noqa: SLF001
        assert reply["leave"] == [["m", 2]] and len(driver.failures) == 1  # reported once, not twice
        assert driver.reset_count == 1
        # Then one worker of b fails too: every host must leave, and that ends the job clearly.
        reply = driver._world([["b", "m", 3, 2]])  # noqa: SLF001
        assert reply["ok"] is False and "every host of the job must leave (b: excluded after a failure)" in \
            reply["fatal"] and driver.fatal == reply["fatal"]
    finally:
        driver.stop()


def test_a_job_on_this_machine_alone_keeps_its_survivors():
    """Without a host list, excluding the only host would end the job at its first failure: the survivors stay,
    and the host only gets no new workers."""
    driver, _logs = _driver({"localhost": 3}, keep_survivors=True)
    try:
        driver._world([["localhost", "m", 1, 0], ["localhost", "m", 2, 0], ["localhost", "m", 3, 0]])  # noqa: SLF001
        assert driver._world([["localhost", "m", 1, 1], ["localhost", "m", 2, 1]]) == {"ok": True, "leave": []}  # noqa: SLF001
        assert driver.table.free_slots() == [] and len(driver.failures) == 1
    finally:
        driver.stop()


def test_cooldown_grows_like_horovods():
    """LO * 2**n + U(0, LO), kept within LO..HI; a second worker of a host already cooling down does not
    extend it."""
    t = HostTable(cooldown=(1.0, 10.0))
    t.update({"a": 1})
    first = t.exclude("a")
    assert first is not None and 2.0 <= first <= 3.0
    assert t.exclude("a") <= first  # the same failure's other worker
    t.excluded["a"] = 0.0  # the cool-down is over
    second = t.exclude("a")
    assert second is not None and 4.0 <= second <= 5.0
    capped = HostTable(cooldown=(1.0, 2.0))
    capped.update({"a": 1})
    assert capped.exclude("a") == 2.0


def test_driver_records_the_end_of_training_and_horovods_start():
    driver, _logs = _driver({"a": 2, "b": 2})
    try:
        assert driver.initial_assignment(2, 1.0) == ["a", "a", "b", "b"]  # every slot, waited for -np only
        driver.handle({"op": "done"})
        assert driver.done
        driver.forget_world()
        assert not driver.done
    finally:
        driver.stop()


def test_driver_tells_a_cut_off_host_by_its_workers_falling_silent():
    """After a stall, a host whose workers stopped asking the driver well before the others is the cut one (a
    reachable rank stuck in a reset reports no stall but still polls)."""
    import time

    driver, _logs = _driver({"n1": 1, "n2": 1, "n3": 1})
    try:
        now = time.monotonic()
        driver.last_seen.update(n1=now, n2=now - 0.8, n3=now - 6.0)
        assert driver.unreachable(["n1", "n3"]) == ["n3"]
        assert driver.unreachable(["n1", "n2"]) == []
        driver.handle({"op": "poll", "real": "n3"})
        assert driver.unreachable(["n3"]) == []
        assert driver.lose_hosts(["n3"], "cut off") == ["n3"]
        assert any("host n3 was lost (cut off); n3 is excluded" in m for m in _logs), _logs
    finally:
        driver.stop()


def test_a_failed_hosts_workers_leave_even_if_its_cooldown_ended_meanwhile():
    """The others may take longer to re-form than a short cool-down lasts: the excluded host's workers still
    leave at that reset (Horovod stops them at once)."""
    driver, logs = _driver({"a": 2, "b": 2}, cooldown=(0.0, 0.0))
    try:
        driver._world([["a", "m", 1, 0], ["a", "m", 2, 0], ["b", "m", 3, 0], ["b", "m", 4, 0]])  # noqa: SLF001
        driver.handle({"op": "failed", "host": "b", "real": "m", "pid": 4, "error": "RuntimeError: x"})
        assert "b" in driver.table.usable(), "a zero cool-down: b is offered again at once"
        reply = driver._world([["a", "m", 1, 1], ["a", "m", 2, 1], ["b", "m", 3, 1]])  # noqa: SLF001
        assert reply["leave"] == [["m", 3]], reply
        assert any("1 worker(s) leave at this reset: b (excluded after a failure)" in m for m in logs), logs
    finally:
        driver.stop()


def test_driver_knows_when_every_worker_has_ended():
    driver, _logs = _driver({"a": 2})
    try:
        driver._world([["a", "m", 1, 0], ["a", "m", 2, 0]])  # noqa: SLF001
        driver.handle({"op": "bye", "real": "m", "pid": 1})
        driver.handle({"op": "done"})
        assert driver.ended_at is None
        driver.handle({"op": "bye", "real": "m", "pid": 2})
        assert driver.ended_at is not None
    finally:
        driver.stop()
