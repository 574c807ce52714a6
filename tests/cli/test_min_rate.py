"""`cli submit --min-rate` and `#ATTUNE --min-rate`: sent, refused when bad, shown by `cli show`."""

from __future__ import annotations

import re

import pytest

from scheduler_app.models import Job
from tests.cli.helpers import run

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("fifo_proportional_minute_rounds"),
]


def test_submit_with_a_min_rate_and_show_it(service, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    code, out, _ = run(
        capsys, "submit", "rate", "--workload", "res18", "--gpus", "1", "--iters", "500", "--min-rate", "0.25"
    )
    assert code == 0, out
    job = Job.objects.get(name="rate")
    assert job.qos_min_rate_iters_per_s == 0.25 and job.qos_deadline_at is None
    # res18 runs at about 1.6 iterations/s at the proportional share: 0.25 is attainable.
    assert "QoS target (minimum rate): attainable" in out
    code, out, _ = run(capsys, "show", str(job.pk))
    assert code == 0 and re.search(r"^QoS +at least 0.25 iterations/s while running$", out, re.M)
    code, out, _ = run(capsys, "queue")
    assert code == 0 and re.search(rf"^{job.pk} +rate .*>=0.25 it/s$", out, re.M)


def test_a_rate_the_cluster_cannot_give_is_accepted_at_risk(service, capsys):
    run(capsys, "--server", service, "login", "--username", "alice")
    code, out, _ = run(
        capsys, "submit", "fast", "--workload", "res18", "--gpus", "1", "--iters", "500", "--min-rate", "100"
    )
    assert code == 0, out
    assert "QoS target (minimum rate): AT RISK: the job is accepted, but predicted to run slower" in out
    code, out, _ = run(capsys, "show", str(Job.objects.get(name="fast").pk))
    assert re.search(r"^QoS target +AT RISK: predicted to run below its minimum rate on average$", out, re.M)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--min-rate", "0"],
            "error: --min-rate: the rate must be a positive number of iterations per second",
        ),
        (["--min-rate", "fast"], "error: --min-rate: 'fast' is not a number"),
        (
            ["--min-rate", "2", "--max-latency", "6h"],
            "error: give one QoS target: --deadline, --max-latency or --min-rate, not --max-latency and "
            "--min-rate",
        ),
    ],
)
def test_bad_rates_are_refused_before_anything_is_sent(service, capsys, extra, message):
    run(capsys, "--server", service, "login", "--username", "alice")
    code, _, err = run(capsys, "submit", "x", "--workload", "res18", "--iters", "10", *extra)
    assert code == 2 and err.startswith(message), err
    assert not Job.objects.filter(name="x").exists()


def test_a_scripts_min_rate_directive(service, capsys, tmp_path):
    run(capsys, "--server", service, "login", "--username", "alice")
    script = tmp_path / "rate.sh"
    script.write_text("#!/bin/bash\n#SBATCH --gpus=1\n#ATTUNE --iters 100 --min-rate 3.5\npython train.py\n")
    code, out, _ = run(capsys, "submit", str(script))
    assert code == 0, out
    assert Job.objects.get(name="rate.sh").qos_min_rate_iters_per_s == 3.5
    script.write_text("#!/bin/bash\n#ATTUNE --min-rate -1\ntrue\n")
    code, _, err = run(capsys, "submit", str(script))
    assert code == 1 and "--min-rate needs a positive number" in err
