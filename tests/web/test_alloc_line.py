"""An allocation's one-line summary (templates/web/_alloc.html), as the queue and job pages show it."""

from types import SimpleNamespace

from django.template.loader import render_to_string


def _line(num_cpus: int) -> str:
    holds = [SimpleNamespace(gpu=SimpleNamespace(index=i)) for i in (6, 7)]
    alloc = SimpleNamespace(
        server=SimpleNamespace(name="gpu02"),
        gpu_holds=SimpleNamespace(all=lambda: holds),
        num_cpus=num_cpus,
        mem_gb=20.0,
    )
    return render_to_string("web/_alloc.html", {"a": alloc})


def test_one_core_is_singular_and_several_plural():
    assert "<strong>gpu02</strong> GPU 6,7 · 1 core · 20 GB" in _line(1)
    assert "<strong>gpu02</strong> GPU 6,7 · 6 cores · 20 GB" in _line(6)
