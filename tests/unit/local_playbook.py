"""One playbook run on localhost as Ansible runs it (the collection from this checkout, the JSON
callback), for the tests that drive modules and roles through ansible-playbook."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run_local_playbook(tmp_path, play, options=(), extra_env=None):
    """(the process, the first play's tasks as the JSON callback reports them)."""
    playbook = tmp_path / "play.yml"
    playbook.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, **play}]))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "false",
        "PATH": f"{BIN}:{os.environ['PATH']}",
        **(extra_env or {}),
    }
    argv = [str(BIN / "ansible-playbook"), "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}", str(playbook), *options]
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, check=False)
    output = json.loads(proc.stdout[proc.stdout.index("{") :])
    return proc, output["plays"][0]["tasks"]
