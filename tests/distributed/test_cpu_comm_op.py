"""The CPU all-reduce build removes a lock left by a killed build, but never one a live build holds."""

import multiprocessing
import time

from distributed_spec.distributed.cpu_comm_op import SHM_OP_NAME, build_under_flock


def _torch_lock(root):
    return root / "py311_cpu" / SHM_OP_NAME / "lock"


def test_a_lock_left_by_a_killed_build_is_removed_before_building(tmp_path):
    lock = _torch_lock(tmp_path)
    lock.parent.mkdir(parents=True)
    lock.touch()  # what a shard killed inside torch's FileBaton leaves behind
    other = tmp_path / "py311_cpu" / "another_op" / "lock"
    other.parent.mkdir(parents=True)
    other.touch()

    seen = []
    result = build_under_flock(tmp_path, SHM_OP_NAME, lambda: seen.append(lock.exists()) or "module")

    assert result == "module"
    assert seen == [False]  # torch's baton would have waited on it forever
    assert other.exists()  # only this op's lock is ours to judge


def _build_slowly(root, started, log):
    def build():
        _torch_lock(root).parent.mkdir(parents=True, exist_ok=True)
        _torch_lock(root).touch()  # a live torch build holds its lock file while it compiles
        started.set()
        time.sleep(1.0)
        with open(log, "a") as f:
            f.write("first\n")
        _torch_lock(root).unlink()

    build_under_flock(root, SHM_OP_NAME, build)


def test_a_second_shard_waits_for_a_live_build_and_keeps_its_lock(tmp_path):
    log = tmp_path / "log"
    context = multiprocessing.get_context("fork")
    started = context.Event()
    first = context.Process(target=_build_slowly, args=(tmp_path, started, log))
    first.start()
    assert started.wait(10)

    def second_build():
        with open(log, "a") as f:
            f.write("second\n")

    build_under_flock(tmp_path, SHM_OP_NAME, second_build)
    first.join(10)

    assert first.exitcode == 0
    assert log.read_text().split() == ["first", "second"]  # no removal under a live build


def test_the_flock_dies_with_a_killed_builder(tmp_path):
    context = multiprocessing.get_context("fork")
    started = context.Event()

    def build_forever():
        _torch_lock(tmp_path).parent.mkdir(parents=True, exist_ok=True)
        _torch_lock(tmp_path).touch()
        started.set()
        time.sleep(60)

    killed = context.Process(target=build_under_flock, args=(tmp_path, SHM_OP_NAME, build_forever))
    killed.start()
    assert started.wait(10)
    killed.kill()
    killed.join(10)

    begin = time.perf_counter()
    assert build_under_flock(tmp_path, SHM_OP_NAME, lambda: _torch_lock(tmp_path).exists()) is False
    assert time.perf_counter() - begin < 5


def test_the_op_name_is_deepspeeds(monkeypatch):
    # A wrong name would make the stale-lock glob match nothing, silently.
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    from deepspeed.ops.op_builder.cpu.comm import ShareMemCommBuilder  # noqa: PLC0415

    assert ShareMemCommBuilder.NAME == SHM_OP_NAME
