"""serve's OpenMP wait policy: PASSIVE unless the user chose, and said when it came too late."""

from servescope.openmp import openmp_loaded, prefer_passive_wait


def test_passive_is_set_before_openmp_loads_and_the_workers_it_starts_say_it_is_servescopes():
    env: dict[str, str] = {}
    wait = prefer_passive_wait(env, loaded=False)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert (wait.policy, wait.source) == ("PASSIVE", "servescope")
    again = prefer_passive_wait(dict(env), loaded=True)  # a worker process: OpenMP loaded since, by our choice
    assert (again.policy, again.source) == ("PASSIVE", "servescope")


def test_the_users_own_policy_is_kept_whichever_variable_they_set():
    for var, value in (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "10000"), ("KMP_BLOCKTIME", "0")):
        env = {var: value}
        wait = prefer_passive_wait(env, loaded=False)
        assert env == {var: value}
        assert wait.source == "yours" and wait.policy == f"{var}={value}"


def test_too_late_when_openmp_is_already_loaded_says_what_to_set():
    env: dict[str, str] = {}
    wait = prefer_passive_wait(env, loaded=True)
    assert env == {}
    assert wait.source == "too late" and "OMP_WAIT_POLICY=PASSIVE" in wait.words


def test_a_loaded_openmp_runtime_is_read_from_the_process_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f0-7f1 r-xp 0 08:01 1 /usr/lib/libc.so.6\n")
    assert openmp_loaded(str(maps)) is False
    maps.write_text(maps.read_text() + "7f2-7f3 r-xp 0 08:01 2 /site-packages/torch/lib/libgomp-a34b3233.so.1\n")
    assert openmp_loaded(str(maps)) is True
    assert openmp_loaded(str(tmp_path / "none")) is None

