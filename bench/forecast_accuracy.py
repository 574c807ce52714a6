"""How good Attune's start predictions were, and how long the queue got, in a database that ran jobs.

Run it against a service that has been running, e.g. after `make demo` for 20 minutes (same
settings: with no DATABASE_URL it reads the demo's embedded database under var/):

    python -m bench.forecast_accuracy [--since-minutes 20]

For every job submitted in the window that has started, the prediction made at its submission
(AdmissionPrediction, services/admission.py) is compared with its real start: prints the median
absolute error of the predicted start next to the median wait (start minus submission) and their
ratio (the target: under 20 %, over the jobs that waited at least --min-wait-s: a job that starts at
the round its submission asks for has nothing to predict), the p90 error, and the most jobs that
were pending at once (sampled every 10 s from the jobs' submission, start and end times). Exits 1 if
the ratio is 20 % or more, or no started job waited.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from datetime import datetime, timedelta

TARGET_RATIO = 0.20


def _setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def _max_pending(
    jobs: list[tuple[datetime, datetime | None, datetime | None]], since: datetime, until: datetime
) -> int:
    """The most jobs waiting at once: submitted, not yet started, not yet ended (cancelled while pending)."""
    most, t = 0, since
    while t <= until:
        waiting = sum(
            1
            for submitted, started, finished in jobs
            if submitted <= t and (started is None or started > t) and (finished is None or finished > t)
        )
        most = max(most, waiting)
        t += timedelta(seconds=10)
    return most


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since-minutes", type=float, default=20.0, help="jobs submitted this recently")
    parser.add_argument("--min-wait-s", type=float, default=30.0, help="judge jobs that waited this long")
    args = parser.parse_args(argv)
    _setup_django()
    from django.utils import timezone

    from bench.common import print_table
    from scheduler_app.models import AdmissionPrediction, Job

    now = timezone.now()
    since = now - timedelta(minutes=args.since_minutes)
    jobs = list(
        Job.objects.filter(submitted_at__gte=since).values_list("submitted_at", "started_at", "finished_at")
    )
    rows = AdmissionPrediction.objects.filter(
        job__submitted_at__gte=since, job__started_at__isnull=False, predicted_start_at__isnull=False
    ).values_list("predicted_start_at", "job__started_at", "job__submitted_at")
    started = [
        (abs((start - predicted).total_seconds()), max(0.0, (start - submitted).total_seconds()))
        for predicted, start, submitted in rows
    ]
    # A job that starts at the round its submission asks for waited nothing and was predicted to: the
    # ratio is taken over the jobs that waited, where a forecast has something to get right.
    waited = [(error_s, wait_s) for error_s, wait_s in started if wait_s >= args.min_wait_s]
    most_pending = _max_pending(jobs, since, now)
    print(
        f"window: the last {args.since_minutes:g} min; jobs submitted: {len(jobs)}; "
        f"started with a prediction: {len(started)}, "
        f"of which waited {args.min_wait_s:g} s or more: {len(waited)}"
    )
    table = []
    for label, sample in (("all started", started), (f"waited >= {args.min_wait_s:g} s", waited)):
        if not sample:
            table.append([label, 0, "-", "-", "-", "-", "-", most_pending])
            continue
        errors_s, waits_s = [e for e, _ in sample], [w for _, w in sample]
        median_error_s, median_wait_s = statistics.median(errors_s), statistics.median(waits_s)
        p90_error_s = statistics.quantiles(errors_s, n=10)[-1] if len(errors_s) >= 2 else errors_s[0]
        ratio = median_error_s / median_wait_s if median_wait_s > 0 else 0.0
        # The summed error over the summed wait (WAPE): every job counts by how long it waited, so the
        # sub-second waits of jobs that start at once neither hide nor dominate the figure.
        weighted = sum(errors_s) / sum(waits_s) if sum(waits_s) > 0 else 0.0
        table.append(
            [
                label,
                len(sample),
                f"{median_error_s:.1f}",
                f"{p90_error_s:.1f}",
                f"{median_wait_s:.1f}",
                f"{ratio:.1%}",
                f"{weighted:.1%}",
                most_pending,
            ]
        )
    print_table(
        [
            "jobs",
            "n",
            "median |start error| s",
            "p90 |start error| s",
            "median wait s",
            "median error / median wait",
            "sum error / sum wait",
            "most pending",
        ],
        table,
    )
    if not waited:
        print("no started job waited: nothing to judge the forecast on yet (let the service run longer)")
        return 1
    errors_s, waits_s = [e for e, _ in waited], [w for _, w in waited]
    ratio = statistics.median(errors_s) / statistics.median(waits_s)
    ok = ratio < TARGET_RATIO
    print(
        f"median start error is {ratio:.1%} of the median wait: "
        f"{'within' if ok else 'over'} the {TARGET_RATIO:.0%} target"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
