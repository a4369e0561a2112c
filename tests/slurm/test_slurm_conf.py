"""On a real Slurm: a cluster that already runs its own prolog, epilog, PrologFlags,
SchedulerParameters and health check (a stand-in NHC) takes the lines `slurmhealth config
slurm-conf` prints, applied as printed with its node commands run, on `scontrol reconfigure`;
then both run: the site's scripts before slurmhealth's, NHC from slurmhealth's hook."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest
from conftest import require_real

from . import advice
from .lab import REPO, Lab, missing

HOOK = os.path.join(REPO, "packaging", "slurmhealth-hook")
SLURMHEALTH = [sys.executable, "-m", "slurmhealth"]
NODE = "gpu01"


class SiteLab(Lab):
    """The lab as a site ran it before slurmhealth: the site's own prolog, epilog, flags,
    scheduler options (in a file included by the cluster's name, which slurmctld puts in lower
    case) and health check in place of slurmhealth's."""

    SCHED = "SchedulerParameters=batch_sched_delay=0,sched_interval=1\n"

    def __init__(self, site: str, **options: object) -> None:
        super().__init__(**options)
        self.site = site

    def _write_files(self) -> None:
        with open(self.path("etc", "lab-sched.conf"), "w") as handle:
            handle.write(self.SCHED)
        super()._write_files()

    def slurm_conf(self) -> str:
        site = {
            "ClusterName": "Lab",
            "Prolog": f"{self.site}/prolog.sh",
            "Epilog": f"{self.site}/epilog.sh",
            "PrologFlags": "Serial",
            "SchedulerParameters": None,
            "HealthCheckProgram": f"{self.site}/nhc",
        }
        text = super().slurm_conf()
        for key, value in site.items():
            line = f"{key}={value}" if value else "Include %c-sched.conf"
            text, found = re.subn(rf"^{key}=.*$", line, text, flags=re.M)
            assert found == 1, key
        return text


def _stand_in(path: str, line: str, status: int = 0) -> None:
    """A site's script that appends one line (with the time) to `ran` beside it."""
    ran = os.path.join(os.path.dirname(path), "ran")
    with open(path + ".new", "w") as handle:
        handle.write(f'#!/bin/sh\necho "{line} $(date +%s.%N)" >> {ran}\nexit {status}\n')
    os.chmod(path + ".new", 0o755)
    os.replace(path + ".new", path)  # slurmd never runs half a script


@pytest.fixture(scope="module")
def site_lab(tmp_path_factory):
    reason = missing()
    if reason:
        require_real(f"the real-Slurm tests cannot run: {reason}")
    site = tmp_path_factory.mktemp("site")
    os.chmod(site, 0o755)
    _stand_in(str(site / "prolog.sh"), "prolog $SLURM_JOB_ID")
    _stand_in(str(site / "epilog.sh"), "epilog $SLURM_JOB_ID")
    # NHC: who ran it (slurmhealth's hook exports SLURMHEALTH_REFUSE_STATUS=10)
    _stand_in(str(site / "nhc"), "nhc ${SLURMHEALTH_REFUSE_STATUS:-slurmd}")
    with SiteLab(str(site), nodes=1) as lab:
        yield lab


def ran(lab: SiteLab) -> dict:
    """{what ran: when} from the site's stand-ins (the last time of each)."""
    try:
        with open(os.path.join(lab.site, "ran")) as handle:
            lines = handle.read().splitlines()
    except FileNotFoundError:
        return {}
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines}


def wait_ran(lab: SiteLab, what: str, after: float = 0) -> float:
    lab._poll(lambda: ran(lab).get(what, 0) > after, 30, f"the site's {what}")
    return ran(lab)[what]


def show_config(lab: SiteLab) -> dict:
    out = lab.scontrol("show", "config").stdout
    return dict(re.findall(r"^(\w+)\s+= (.*)$", out, re.M))


def slurm_conf(lab: SiteLab, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SLURMHEALTH, "config", "slurm-conf", lab.conf, "--hook", HOOK, *args],
        capture_output=True,
        text=True,
        env=lab.client_env(),
        timeout=60,
    )


def test_a_site_keeps_its_scripts_and_nhc_beside_slurmhealth(site_lab):
    lab = site_lab
    before = lab.submit("true")
    assert lab.wait_job(before)["JobState"] == "COMPLETED"
    wait_ran(lab, f"epilog {before}")
    assert f"prolog {before}" in ran(lab) and lab.runs(NODE, "prolog") == []
    wait_ran(lab, "nhc slurmd")

    done = slurm_conf(lab, "--check")
    assert done.returncode == 1, done.stderr
    assert [line.split("=")[0] for line, _ in advice.blocks(done.stdout)] == [
        "Prolog",
        "Epilog",
        "PrologFlags",
        "SchedulerParameters",
        "PrologEpilogTimeout",
        "HealthCheckProgram",
    ]
    assert f"# was {lab.path('etc', 'lab-sched.conf')}:1: {SiteLab.SCHED}" in done.stdout
    advice.apply(done.stdout, lab.conf)
    lab.scontrol("reconfigure")
    lab._poll(lambda: show_config(lab)["PrologFlags"] == "Alloc,Serial", 20, "the new config")
    config = show_config(lab)
    assert config["Prolog"] == lab.path("etc", "prolog.d", "*")
    assert config["Epilog"] == lab.path("etc", "epilog.d", "*")
    assert config["SchedulerParameters"] == (
        "batch_sched_delay=0,sched_interval=1,nohold_on_prolog_fail"
    )
    assert (config["PrologEpilogTimeout"], config["HealthCheckProgram"]) == ("30", HOOK)
    assert "specified more than once" not in lab.log("slurmctld")

    t0 = time.time()
    job = lab.submit("true")
    assert lab.wait_job(job)["JobState"] == "COMPLETED"
    (ours,) = lab.wait_runs(NODE, "prolog", job_id=job)
    site_prolog = wait_ran(lab, f"prolog {job}")
    assert site_prolog <= ours["started"], "slurmd runs 90-site-prolog.sh before 50-slurmhealth"
    lab.wait_runs(NODE, "epilog", job_id=job)
    wait_ran(lab, f"epilog {job}")
    lab.wait_runs(NODE, "healthcheck", after=t0)
    wait_ran(lab, "nhc 10", after=t0)
    assert slurm_conf(lab, "--check").returncode == 0, "nothing left to change"

    # The site's prolog failing: slurmd stops there (slurmhealth's never runs for that job),
    # drains the node, and requeues the job without holding it (nohold_on_prolog_fail, merged).
    _stand_in(os.path.join(lab.site, "prolog.sh"), "prolog $SLURM_JOB_ID", status=1)
    failed = lab.submit("true")
    wait_ran(lab, f"prolog {failed}")
    drained = lab.wait_node(NODE, lambda n: "DRAIN" in n["state"], what="drained")
    assert drained["reason"] == "Prolog error"
    held = lab.wait_job(failed, ("PENDING",))
    assert held["Restarts"] == "1" and held["Priority"] != "0", held
    assert lab.runs(NODE, "prolog", job_id=failed) == []
    lab.scancel(failed)
    _stand_in(os.path.join(lab.site, "prolog.sh"), "prolog $SLURM_JOB_ID")
    lab.resume(NODE)
