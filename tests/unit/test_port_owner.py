import os
import subprocess
import sys
import time

from ansible_collections.frank.llm_fleet.plugins.module_utils.host.port_owner import judge_listener, listeners_on, parse_ss_listeners, read_proc, unified_cgroup

SS = """LISTEN 0      512          0.0.0.0:7771       0.0.0.0:*    users:(("llama-server",pid=4242,fd=3))
LISTEN 0      4096       127.0.0.1:18080      0.0.0.0:*    users:(("python3",pid=77,fd=5),("python3",pid=78,fd=5))
LISTEN 0      128             [::]:22            [::]:*    users:(("sshd",pid=1,fd=4))
"""


def test_ss_output_is_parsed_per_port_with_every_pid():
    listeners = parse_ss_listeners(SS)
    assert [(listener.address, listener.port) for listener in listeners] == [("0.0.0.0", 7771), ("127.0.0.1", 18080), ("::", 22)]
    assert listeners_on(SS, 18080)[0].pids == [77, 78]


def test_unified_cgroup_prefers_v2_then_name_systemd():
    assert unified_cgroup("12:pids:/x\n1:name=systemd:/system.slice/a.service\n0::/system.slice/a.service\n") == "/system.slice/a.service"
    assert unified_cgroup("1:name=systemd:/system.slice/b.service\n") == "/system.slice/b.service"


def test_a_process_outside_the_cgroup_and_container_is_foreign():
    me = read_proc(os.getpid())
    verdict = judge_listener(os.getpid(), "/system.slice/not-mine.service", None, None)
    assert not verdict.owned and verdict.foreign and str(os.getpid()) in verdict.reason
    assert me is not None and me.cmdline


def test_the_container_engine_and_its_children_are_owned_and_must_be_fresh():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.1)
        owned = judge_listener(child.pid, "", os.getpid(), None)
        assert owned.owned and "container" in owned.reason
        # Started long after this point in the past: fresh. Started before "now + 10 s": stale.
        stale = judge_listener(child.pid, "", os.getpid(), time.clock_gettime(time.CLOCK_BOOTTIME) + 10)
        assert not stale.owned and not stale.foreign and "survivor" in stale.reason
    finally:
        child.kill()
        child.wait()


def test_same_cgroup_counts_as_the_units():
    me = read_proc(os.getpid())
    assert judge_listener(os.getpid(), me.cgroup, None, None).owned
