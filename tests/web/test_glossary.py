"""The glossary: every name the code accepts or emits has its line; the tag, the filter and /glossary/."""

from __future__ import annotations

import ast
from pathlib import Path
from urllib.parse import quote

import pytest
from django.template import Context, Template

from agent.launcher import ISOLATION_MODES
from cluster_app.models import NodeState
from scheduler_app import glossary
from scheduler_app.core import reasons
from scheduler_app.core.allocators import ALLOCATORS
from scheduler_app.core.policies import POLICIES
from scheduler_app.models import TERMINAL_JOB_STATES, JobState, PendingReason
from scheduler_app.services.job_lifecycle import TRANSITIONS
from tests.web.conftest import pending_job

ROOT = Path(__file__).resolve().parents[2]
# Where job events are written: every app's own code (not tests, not the agent, which only reports).
EVENT_SOURCES = ("scheduler_app", "cluster_app", "profiles_app", "notify_app")
# Calls that create a JobEvent, and where their kind is: (positional index, keyword names). An event
# of a state change takes its kind from the lifecycle's table (TRANSITIONS), read below.
EVENT_CALLS = {
    "job_event": (1, ("kind",)),
    "job_event_append": (None, ("kind",)),
    "JobEvent": (None, ("kind",)),
    "create": (None, ("kind",)),  # JobEvent.objects.create only (checked below)
}
# Kinds that are not string literals where they are written: the pass-through parameters of the
# helpers above, and job_finish's `state.lower()` (a terminal state, lowered).
PASS_THROUGH = {"kind", "next_kind"}


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        if func.attr == "create":
            target = ast.unparse(func.value)
            return "create" if target == "JobEvent.objects" else None
        return func.attr
    return None


def emitted_event_kinds() -> set[str]:
    """Every JobEvent kind the code writes, read from the source (ast), so a new kind is noticed, and
    those of the lifecycle's transitions."""
    kinds: set[str] = {transition.kind for transition in TRANSITIONS.values()}
    for app in EVENT_SOURCES:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts or "tests" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.Call) or _call_name(node) not in EVENT_CALLS:
                    continue
                index, keywords = EVENT_CALLS[_call_name(node)]
                exprs = [k.value for k in node.keywords if k.arg in keywords]
                if index is not None and len(node.args) > index:
                    exprs.append(node.args[index])
                for expr in exprs:
                    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
                        kinds.add(expr.value)
                    elif ast.unparse(expr) == "state.lower()":
                        kinds |= {state.lower() for state in TERMINAL_JOB_STATES}
                    else:
                        where = f"{path.relative_to(ROOT)}:{node.lineno}"
                        assert ast.unparse(expr) in PASS_THROUGH, f"{where}: a kind this test cannot read"
    return kinds


def test_the_event_scan_finds_the_kinds_it_should():
    kinds = emitted_event_kinds()
    assert {"submitted", "scheduled", "preempted", "requeued", "lease_started", "completed"} <= kinds


@pytest.mark.parametrize(
    ("what", "names"),
    [
        ("policy", POLICIES.names()),
        ("allocator", ALLOCATORS.names()),
        ("pending reason", [r.value for r in PendingReason]),
        (
            "decision reason",
            sorted(reasons.PLACED_REASONS | reasons.PENDING_REASONS | reasons.INFEASIBLE_REASONS),
        ),
        ("job state", [s.value for s in JobState]),
        ("server state", [s.value for s in NodeState]),
        ("isolation mode", list(ISOLATION_MODES)),
        ("job event", sorted(emitted_event_kinds())),
        ("what-if workload", ["philly", "genie"]),
    ],
)
def test_every_name_the_code_uses_is_explained(what, names):
    missing = [n for n in names if not glossary.explain(n)]
    assert not missing, f"{what}s without a line in scheduler_app/glossary.py: {missing}"


def test_the_table_is_one_line_per_term():
    assert sum(len(entries) for _, entries in glossary.SECTIONS) == len(glossary.GLOSSARY)  # no duplicate
    for term, line in glossary.GLOSSARY.items():
        assert line.strip() and "\n" not in line and line.endswith((".", ")")), term


def test_the_simulator_workloads_are_the_ones_explained():
    from scheduler_app.services.simulations import WORKLOADS

    assert all(glossary.explain(w) for w in WORKLOADS)


@pytest.mark.parametrize(
    ("template", "text"),
    [
        ('{% term "fifo" %}', f'<abbr class="term" title="{glossary.GLOSSARY["fifo"]}">fifo</abbr>'),
        (
            '{% term "Priority" "code" %}',
            f'<abbr class="term" title="{glossary.GLOSSARY["Priority"]}"><code>Priority</code></abbr>',
        ),
        ('{% term "not-a-term" "code" %}', "<code>not-a-term</code>"),  # unknown: the page as it was
        ("{% term v %}", "&lt;b&gt;"),  # a variable is escaped (a literal in a template is not)
        ('{{ "srtf"|explain }}', glossary.GLOSSARY["srtf"]),
        ('{{ "nope"|explain }}', ""),
    ],
)
def test_the_tag_and_the_filter(template, text):
    assert Template("{% load glossary %}" + template).render(Context({"v": "<b>"})) == text


def test_the_glossary_page_lists_every_term_and_is_linked_from_every_page(client, db):
    html = client.get("/glossary/").content.decode()
    for term in glossary.GLOSSARY:
        assert f'<dt id="term-{quote(term)}"><code>{term}</code></dt>' in html
    assert 'href="/glossary/">Glossary</a></footer>' in client.get("/").content.decode()


def test_pending_reasons_are_explained_where_they_are_shown(user, client_of, cluster):
    job = pending_job(user)
    shown = f'<abbr class="term" title="{glossary.GLOSSARY["Priority"]}"><code>Priority</code></abbr>'
    client = client_of(user)
    assert shown in client.get("/jobs/").content.decode()  # the queue
    assert shown in client.get(f"/jobs/{job.pk}/").content.decode()  # the job's page
