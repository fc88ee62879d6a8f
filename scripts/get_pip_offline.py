"""Stand-in for the get-pip bootstrap script that ansible-test downloads from a host that is
not reachable here: bootstrap pip from the stdlib's bundled wheel, then install the requested
pip from the package registry. ansible-test strips the environment, hence the explicit --cert."""

import ensurepip
import os
import subprocess
import sys

ensurepip.bootstrap(upgrade=True)
requested = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
cert = "/etc/ssl/certs/ca-certificates.crt"
cert_args = ["--cert", cert] if os.path.exists(cert) else []
subprocess.check_call([sys.executable, "-m", "pip", "install", *cert_args, *requested])
